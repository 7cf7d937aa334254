//! Rebuilding the state from a log's records, and writing the state out as
//! records for a snapshot.
//!
//! Every record is a state, so applying one is an upsert: a job record
//! replaces the job, a metadata record overwrites what it holds, a delete of
//! a job not there is nothing. That is what lets a snapshot be taken while
//! commands go on (its jobs read a few at a time, each as it is then): the
//! records written since the snapshot began are replayed on top of it and
//! bring every job to its last state, whichever version the snapshot caught.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::journal::{JobImage, Meta, Record, Stored};
use super::state::{Job, Life, NO_CONN, Replay, Slot, St, State, TubeState};
use crate::clock::Micros;
use crate::names::Tube;
use crate::rules::is_urgent;

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
    /// Starts a replay into this (empty) state: see [`State::replay`].
    pub fn begin_replay(&mut self) {
        self.replay = Some(Replay::default());
    }

    /// Ends a replay: builds every tube's indexes by state, the tubes'
    /// places in `soonest` and the expiries from the jobs in the pool.
    ///
    /// Delayed jobs due by `now` (they fell due while the server was down)
    /// go straight into the ready sets, as the timer would have moved them:
    /// moved by the timer after the replay, one by one, they took longer
    /// than the replay itself (a 1,000,000-job directory whose jobs had all
    /// fallen due: 3.0 s until every job was ready, 1.1 s this way).
    /// The move writes no record, as the timer's does not: a due time is a
    /// wall-clock time, and a replay finds the job due again.
    fn index_replayed(&mut self, now: Micros) {
        self.replay = None;
        #[derive(Default)]
        struct Entries {
            ready: Vec<(u32, u64)>,
            delayed: Vec<(Micros, u64)>,
            buried: Vec<(u64, u64)>,
            urgent: u64,
        }
        let mut by_tube: Vec<Entries> = Vec::new();
        by_tube.resize_with(self.tubes.len(), Entries::default);
        let mut expiries = Vec::new();
        // Jobs come in runs of one tube: the last tube's place saves a
        // hash of its name per job.
        let mut last: Option<(Tube, usize)> = None;
        for (_, job) in self.jobs.iter_mut() {
            let at = match &last {
                Some((tube, at)) if *tube == job.tube => *at,
                _ => {
                    let at = self
                        .tubes
                        .get_index_of(&job.tube)
                        .expect("a job's tube exists");
                    last = Some((job.tube.clone(), at));
                    at
                }
            };
            let entries = &mut by_tube[at];
            if let St::Delayed { due } = job.state
                && due <= now
            {
                job.state = St::Ready;
            }
            match job.state {
                St::Ready => {
                    entries.ready.push((job.pri, job.key));
                    entries.urgent += u64::from(is_urgent(job.pri));
                }
                St::Delayed { due } => entries.delayed.push((due, job.key)),
                St::Buried { seq } => entries.buried.push((seq, job.key)),
                // A replay makes reserved jobs ready (see `live`).
                St::Reserved { .. } => unreachable!("a replayed job is never reserved"),
            }
            if let Some(at) = job.expiry() {
                expiries.push((at, job.key));
            }
        }
        // Sorted here (the entries are unique, so an unstable sort does, at
        // half the cost of the stable one `from_iter` makes), and built into
        // trees bottom up by `from_iter`, which finds them in order.
        fn tree<T: Ord>(mut entries: Vec<T>) -> BTreeSet<T> {
            entries.sort_unstable();
            entries.into_iter().collect()
        }
        for (at, entries) in by_tube.into_iter().enumerate() {
            let (tube, ts) = self.tubes.get_index_mut(at).expect("an index in range");
            ts.ready = tree(entries.ready);
            ts.delayed = tree(entries.delayed);
            ts.buried = tree(entries.buried);
            ts.urgent = entries.urgent;
            if let Some(&(due, _)) = ts.delayed.first() {
                ts.listed = Some(due);
                self.soonest.insert((due, tube.clone()));
            }
        }
        self.expiries = tree(expiries);
    }

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
        // Its place in `tubes` is kept too: the discards below forget no
        // tube, so it holds, and the name is hashed once.
        let last = self.replay.as_ref().and_then(|r| r.last_tube.as_ref());
        let (at, tube) = match last {
            Some((at, tube)) if tube.as_str() == image.tube => (Some(*at), tube.clone()),
            _ => match self.tubes.get_full(image.tube) {
                Some((at, tube, _)) => (Some(at), tube.clone()),
                None => match Tube::parse(image.tube.as_bytes()) {
                    Some(tube) => (None, tube),
                    None => return Applied::Invalid,
                },
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
        // Every job in the pool has a key below `next_key`: a put's record
        // (most of a log) needs no look for the job it would replace.
        let known = if key < self.next_key {
            self.slot(key)
        } else {
            None
        };
        if let Some(slot) = known {
            self.discard(slot);
        }
        if let Some(slot) = name.as_deref().and_then(|n| self.named(n)) {
            self.discard(slot);
        }
        self.next_key = self.next_key.max(key + 1);
        let at = match at {
            Some(at) => at,
            None => self.tubes.insert_full(tube.clone(), TubeState::default()).0,
        };
        if let Some(replay) = &mut self.replay {
            replay.last_tube = Some((at, tube.clone()));
        }
        let ts = &mut self.tubes[at];
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

    /// After a replay: tubes that hold nothing go, as do pauses that ended
    /// while the server was down. Nobody uses or watches a tube yet: its
    /// users went with the process, as at a clean stop, so an empty paused
    /// tube goes with its pause (whose end is logged at the next change, so
    /// that a job later put in a tube of that name is not paused by the
    /// next replay). `total-jobs` counts the jobs created by this
    /// process, as beanstalkd's does after it reads its binlog back.
    pub fn replayed(&mut self, now: Micros) {
        if self.replay.is_some() {
            self.index_replayed(now);
        }
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
            self.forget_if_unused(&tube);
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

    /// The server id the next put takes: recovery raises it past the ids
    /// a log cut short may have handed out.
    pub fn next_key(&self) -> u64 {
        self.next_key
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::job::{JobCounters, Lifecycle};
    use crate::store::memory::journal::{Meta, Round, Volatile};

    /// A small deterministic generator (xorshift), so that a failure
    /// replays the same.
    struct Dice(u64);

    impl Dice {
        fn roll(&mut self, below: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % below
        }
    }

    fn stored(dice: &mut Dice) -> Stored {
        match dice.roll(4) {
            0 => Stored::Ready,
            1 => Stored::Delayed(1_000_000 + dice.roll(50) * 1_000),
            2 => Stored::Reserved,
            _ => Stored::Buried(dice.roll(1_000)),
        }
    }

    fn meta(dice: &mut Dice, key: u64) -> Meta {
        Meta {
            key,
            // Either side of the urgent line (1024), with ties.
            pri: [0, 7, 1023, 1024, 5000][dice.roll(5) as usize],
            delay: 0,
            state: stored(dice),
            counters: JobCounters::default(),
            round: Round::default(),
        }
    }

    /// The indexes a state keeps, as comparable values.
    fn indexes(s: &State) -> Vec<String> {
        let mut out: Vec<String> = s
            .tubes
            .iter()
            .map(|(tube, ts)| {
                format!(
                    "{tube:?} ready {:?} delayed {:?} buried {:?} urgent {} listed {:?} pause {:?}",
                    ts.ready, ts.delayed, ts.buried, ts.urgent, ts.listed, ts.pause
                )
            })
            .collect();
        out.sort();
        out.push(format!("soonest {:?}", s.soonest));
        out.push(format!("expiries {:?}", s.expiries));
        out.push(format!("next {} bury {}", s.next_key, s.bury_seq));
        out
    }

    /// A replay that builds the indexes at its end leaves them exactly as
    /// one that keeps them up record by record: every state, priorities
    /// either side of the urgent line, jobs replaced, changed and deleted
    /// (whole tubes emptied), times to live.
    #[test]
    fn indexes_built_at_the_end_match_those_kept_as_records_come() {
        // Among the delayed jobs' due times (see `stored`): some fell due
        // while the server was down.
        const NOW: Micros = 1_025_000;
        let mut due_moved = 0;
        for seed in 1..40u64 {
            let mut dice = Dice(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let tubes = ["default", "mail", "orders", "refunds"];
            let bodies: Vec<Vec<u8>> = (0..4).map(|n| vec![n; n as usize]).collect();
            let mut records = Vec::new();
            let mut next = 1u64;
            for _ in 0..400 {
                match dice.roll(10) {
                    0..5 => {
                        let options = if dice.roll(3) == 0 {
                            Lifecycle {
                                ttl: Some(Duration::from_secs(dice.roll(100) + 1)),
                                ..Lifecycle::default()
                            }
                        } else {
                            Lifecycle::default()
                        };
                        // A put, now and then the same job again (a
                        // snapshot's copy of it).
                        let key = if next > 1 && dice.roll(8) == 0 {
                            1 + dice.roll(next - 1)
                        } else {
                            next += 1;
                            next - 1
                        };
                        records.push((
                            key,
                            Some((tubes[dice.roll(4) as usize], dice.roll(4) as usize, options)),
                        ));
                    }
                    5..8 => records.push((1 + dice.roll(next), None)),
                    _ => records.push((u64::MAX - 1 - dice.roll(next), None)),
                }
            }
            let mut replay = |defer: bool| {
                let mut dice = Dice(seed);
                let mut s = State::new();
                if defer {
                    s.begin_replay();
                }
                for (key, job) in &records {
                    let record = match job {
                        Some((tube, body, options)) => Record::Job(JobImage {
                            meta: meta(&mut dice, *key),
                            name: None,
                            tube,
                            ttr: 1_000_000,
                            created: 5_000_000,
                            body: &bodies[*body],
                            options: *options,
                        }),
                        // A change of a job's state, or its delete (keys
                        // counted down from the top stand for deletes).
                        None if *key < u64::MAX / 2 => Record::Meta(meta(&mut dice, *key)),
                        None => Record::Delete(u64::MAX - 1 - key),
                    };
                    assert_eq!(s.apply(record), Applied::Done);
                }
                s.replayed(NOW);
                if !defer {
                    // The jobs due by now, which the built indexes hold
                    // ready, are moved by the timer.
                    let (moved, _) = s.tick(NOW, true, &mut Volatile);
                    due_moved += usize::from(!moved.ready.is_empty());
                }
                s
            };
            let (kept, built) = (replay(false), replay(true));
            assert_eq!(indexes(&built), indexes(&kept), "seed {seed}");
            assert!(built.replay.is_none());
            let delayed: Vec<Micros> = built
                .jobs
                .iter()
                .filter_map(|(_, job)| match job.state {
                    St::Delayed { due } => Some(due),
                    _ => None,
                })
                .collect();
            assert!(
                !delayed.is_empty() && delayed.iter().all(|&due| due > NOW),
                "seed {seed}: delayed jobs due at {delayed:?}, now {NOW}"
            );
        }
        assert!(
            due_moved > 30,
            "jobs fell due in only {due_moved} of 39 replays"
        );
    }

    /// Every job is found by its key (or its client-chosen id), and no
    /// deleted one, however large the tables that find them have grown:
    /// they keep part of each hash to move their entries as they grow (a
    /// doubling at each power of two here), and a lookup must find the
    /// entry by the full key or id.
    #[test]
    fn jobs_are_found_by_key_across_the_growth_of_their_table() {
        let mut dice = Dice(0x2545_f491_4f6c_dd1d);
        let mut s = State::new();
        let body = [b'x'; 8];
        // Keys far apart as well as neighbours, as server ids and imports
        // give them.
        let keys: Vec<u64> = (0..40_000u64)
            .map(|n| if n % 7 == 0 { n << 33 | n } else { n + 1 })
            .collect();
        let names: Vec<String> = (0..keys.len())
            .map(|n| format!("order-close:{n}"))
            .collect();
        let named = |n: usize| n.is_multiple_of(5);
        for (n, &key) in keys.iter().enumerate() {
            let record = Record::Job(JobImage {
                meta: meta(&mut dice, key),
                name: named(n).then_some(names[n].as_str()),
                tube: "default",
                ttr: 1_000_000,
                created: 5_000_000,
                body: &body,
                options: Lifecycle::default(),
            });
            assert_eq!(s.apply(record), Applied::Done);
            // Deletes among the puts, so that the table grows with holes.
            if n % 3 == 2 {
                assert_eq!(s.apply(Record::Delete(keys[n - 1])), Applied::Done);
            }
        }
        for (n, &key) in keys.iter().enumerate() {
            let deleted = n % 3 == 1;
            let found = s.slot(key).map(|slot| s.jobs[slot].key);
            assert_eq!(found, (!deleted).then_some(key), "key {key} (job {n})");
            let by_name = s.named(&names[n]).map(|slot| s.jobs[slot].key);
            let named_here = named(n) && !deleted;
            assert_eq!(by_name, named_here.then_some(key), "{} (job {n})", names[n]);
        }
        assert_eq!(s.slot(1 << 40), None);
        assert_eq!(s.named("order-close:none"), None);
    }
}
