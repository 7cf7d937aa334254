//! Rebuilding the state from a log's records, and writing the state out as
//! records for a snapshot.
//!
//! Every record is a state, so applying one is an upsert: a job record
//! replaces the job, a metadata record overwrites what it holds, a delete of
//! a job not there is nothing. That is what lets a snapshot be taken while
//! commands go on (its jobs read a few at a time, each as it is then): the
//! records written since the snapshot began are replayed on top of it and
//! bring every job to its last state, whichever version the snapshot caught.

use std::sync::Arc;

use super::journal::{JobImage, Meta, Record, Stored};
use super::state::{Job, Life, NO_CONN, Slot, St, State};
use crate::clock::Micros;
use crate::names::Tube;

/// The live state of a kept state: a job reserved when the log was written
/// is ready now (whoever held it is gone), and the try its reserve counted
/// is given back with it ([`Job::give_back_try`]), as when a server that
/// stops gives its jobs back.
fn live(stored: Stored) -> St {
    match stored {
        Stored::Ready | Stored::Reserved => St::Ready,
        Stored::Delayed(due) => St::Delayed { due },
        Stored::Buried(seq) => St::Buried { seq },
    }
}

/// Whether a replayed record was taken, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The state now reflects it.
    Done,
    /// It names a tube or id the state's rules do not allow: the log was
    /// written by something else, or damaged in a way its checksum missed.
    Invalid,
}

impl State {
    /// Applies one record of a log or snapshot.
    pub fn apply(&mut self, record: Record<'_>) -> Applied {
        match record {
            Record::Job(image) => return self.apply_job(&image),
            Record::Meta(meta) => self.apply_meta(meta),
            Record::Delete(key) => {
                if let Some(slot) = self.slot(key) {
                    let job = self.discard(slot);
                    self.forget_if_unused(&job.tube);
                }
            }
            Record::Pause {
                tube,
                length,
                until,
            } => {
                let Some(tube) = Tube::parse(tube.as_bytes()) else {
                    return Applied::Invalid;
                };
                let ts = self.tubes.entry(tube.clone()).or_default();
                let old = std::mem::replace(&mut ts.pause, (until > 0).then_some((length, until)));
                if let Some((_, until)) = old {
                    self.pauses.remove(&(until, tube.clone()));
                }
                if until > 0 {
                    self.pauses.insert((until, tube));
                }
            }
            Record::Taken { name, until } => {
                let Some(name) = crate::names::client_id(name.as_bytes()) else {
                    return Applied::Invalid;
                };
                self.keep_taken(name, until);
            }
            Record::Settings { tube, options } => {
                let Some(tube) = Tube::parse(tube.as_bytes()) else {
                    return Applied::Invalid;
                };
                self.keep_settings(tube, options);
            }
            Record::Schedule { name, encoded } => self.keep_schedule(name, encoded),
            Record::Sequences { next_key, bury_seq } => {
                self.next_key = self.next_key.max(next_key);
                self.bury_seq = self.bury_seq.max(bury_seq);
            }
        }
        Applied::Done
    }

    fn apply_job(&mut self, image: &JobImage<'_>) -> Applied {
        // The tube's name is shared by its jobs, not kept once a job: a
        // million jobs would otherwise hold a million copies of it.
        let tube = match self.tubes.get_key_value(image.tube) {
            Some((tube, _)) => tube.clone(),
            None => match Tube::parse(image.tube.as_bytes()) {
                Some(tube) => tube,
                None => return Applied::Invalid,
            },
        };
        let name: Option<Arc<str>> = match image.name {
            Some(name) => match crate::names::client_id(name.as_bytes()) {
                Some(name) => Some(name),
                None => return Applied::Invalid,
            },
            None => None,
        };
        let key = image.meta.key;
        let known = self.slot(key);
        if let Some(slot) = known {
            self.discard(slot);
        }
        if let Some(slot) = name.as_ref().and_then(|n| self.names.get(n).copied()) {
            self.discard(slot);
        }
        self.next_key = self.next_key.max(key + 1);
        let ts = self.tubes.entry(tube.clone()).or_default();
        if known.is_none() {
            ts.total_jobs += 1;
            self.total_jobs += 1;
        }
        let state = live(image.meta.state);
        if let St::Buried { seq } = state {
            self.bury_seq = self.bury_seq.max(seq);
        }
        let slot = self.insert(Job {
            key,
            name,
            tube,
            pri: image.meta.pri,
            delay: image.meta.delay,
            ttr: image.ttr,
            created: image.created,
            state,
            counters: image.meta.counters,
            body: image.body.into(),
            life: Life::of(image.options, image.meta.round),
        });
        if image.meta.state == Stored::Reserved {
            self.jobs[slot].give_back_try();
        }
        self.link(slot, state, NO_CONN);
        Applied::Done
    }

    fn apply_meta(&mut self, meta: Meta) {
        // A job the state does not have was deleted after the snapshot read
        // it, or before: a later delete record says so either way.
        let Some(slot) = self.slot(meta.key) else {
            return;
        };
        let state = live(meta.state);
        if let St::Buried { seq } = state {
            self.bury_seq = self.bury_seq.max(seq);
        }
        self.unlink(slot);
        let job = &mut self.jobs[slot];
        job.pri = meta.pri;
        job.delay = meta.delay;
        job.counters = meta.counters;
        job.set_round(meta.round);
        if meta.state == Stored::Reserved {
            job.give_back_try();
        }
        self.link(slot, state, NO_CONN);
    }

    /// After a replay: tubes that hold nothing and have no pause to keep go
    /// (nobody uses or watches them yet), as do pauses that ended while the
    /// server was down. `total-jobs` counts the jobs created by this
    /// process, as beanstalkd's does after it reads its binlog back.
    pub fn replayed(&mut self, now: Micros) {
        // Pauses that went in the replay were ended in the log already.
        self.unpaused.clear();
        self.total_jobs = 0;
        for ts in self.tubes.values_mut() {
            ts.total_jobs = 0;
        }
        while let Some((until, _)) = self.taken_until.first() {
            if *until > now {
                break;
            }
            let (_, name) = self.taken_until.pop_first().expect("a first");
            self.taken.remove(&name);
        }
        while let Some(&(until, _)) = self.pauses.first() {
            if until > now {
                break;
            }
            let (_, tube) = self.pauses.pop_first().expect("a first pause");
            if let Some(ts) = self.tubes.get_mut(&tube) {
                ts.pause = None;
            }
        }
        let tubes: Vec<Tube> = self.tubes.keys().cloned().collect();
        for tube in tubes {
            if self.tubes[&tube].pause.is_none() {
                self.forget_if_unused(&tube);
            }
        }
    }

    /// Hands `out` up to `max` jobs from `from` on (slab order), each as a
    /// record as it is now; returns where to go on, or `None` when all were
    /// given. A snapshot reads the state so, a few jobs per lock.
    pub fn dump(&self, from: Slot, max: usize, out: &mut impl FnMut(Record<'_>)) -> Option<Slot> {
        let mut given = 0;
        let mut slot = from;
        let end = self.jobs.capacity();
        while slot < end {
            if given == max {
                return Some(slot);
            }
            if let Some(job) = self.jobs.get(slot) {
                out(Record::Job(job.image()));
                given += 1;
            }
            slot += 1;
        }
        None
    }

    /// Hands `out` what a snapshot ends with: the tubes' pauses and the
    /// sequences.
    pub fn dump_rest(&self, out: &mut impl FnMut(Record<'_>)) {
        for (tube, ts) in &self.tubes {
            if let Some((length, until)) = ts.pause {
                out(Record::Pause {
                    tube: tube.as_str(),
                    length,
                    until,
                });
            }
        }
        for (name, &until) in &self.taken {
            out(Record::Taken { name, until });
        }
        for (tube, &options) in &self.settings {
            out(Record::Settings {
                tube: tube.as_str(),
                options,
            });
        }
        for (name, encoded) in &self.schedules {
            out(Record::Schedule { name, encoded });
        }
        out(Record::Sequences {
            next_key: self.next_key,
            bury_seq: self.bury_seq,
        });
    }
}
