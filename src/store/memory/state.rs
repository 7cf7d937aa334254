//! The embedded engine's state: the job pool and its indexes, and their
//! upkeep. The transitions (`transitions.rs`) and the readings (`stats.rs`)
//! are built on the few primitives here: find a job, take it out of its
//! state's index ([`State::unlink`]), put it into another ([`State::link`]).
//!
//! Every operation is O(log n) or better in the number of jobs: ready jobs sit
//! in a per-tube ordered set keyed by (priority, job key), delayed jobs in a
//! per-tube set keyed by due time, reserved jobs in one set keyed by
//! deadline, so nothing scans the job pool.
//!
//! Memory per job is kept near beanstalkd's: the jobs live in a slab (a
//! vector with a free list, so a million jobs are one array of records and
//! the room it has not used yet is never touched), found by key through a
//! hash table of 4-byte slot numbers; each index holds (order, key) pairs.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use indexmap::IndexMap;
use slab::Slab;

use super::journal::{JobImage, Journal, Meta, Record, Round, Stored};
use crate::clock::Micros;
use crate::job::{Counts, JobBody, JobCounters, LifeStats, Lifecycle};
use crate::names::{JobId, Tube};
use crate::rules::is_urgent;
use crate::store::{ConnId, TubeList, TubeSettings};

/// The holder `link` is given for states other than reserved.
pub(super) const NO_CONN: ConnId = 0;

/// Where a job lives in the slab.
pub(super) type Slot = usize;

/// A job's state, with what orders it in its state's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum St {
    Ready,
    Delayed { due: Micros },
    Reserved { deadline: Micros },
    Buried { seq: u64 },
}

impl St {
    /// The state as a log keeps it.
    pub fn stored(self) -> Stored {
        match self {
            St::Ready => Stored::Ready,
            St::Delayed { due } => Stored::Delayed(due),
            St::Reserved { .. } => Stored::Reserved,
            St::Buried { seq } => Stored::Buried(seq),
        }
    }
}

/// A job in the slab.
pub(super) struct Job {
    /// The job's sequence number: its id unless it has a client-chosen name.
    pub key: u64,
    pub name: Option<Arc<str>>,
    pub tube: Tube,
    pub pri: u32,
    pub delay: Micros,
    pub ttr: Micros,
    pub created: Micros,
    pub state: St,
    pub counters: JobCounters,
    /// A boxed slice rather than `Bytes`: half the size in the record, and a
    /// backlog of a million jobs is mostly records.
    pub body: Box<[u8]>,
    /// Its options and tries, boxed: most jobs have none, and a pointer
    /// costs them less than the options would.
    pub life: Option<Box<Life>>,
}

/// The options of a job put with any, and where it is in its tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Life {
    pub options: Lifecycle,
    pub round: Round,
    /// Its time to live ran out while a worker held it: it goes when the
    /// worker lets go of it. Not kept: after a restart the job is ready,
    /// and the timer finds it expired again.
    pub expired: bool,
}

impl Life {
    /// A job's life for `options`, none if they are all unset.
    pub fn of(options: Lifecycle, round: Round) -> Option<Box<Life>> {
        (!options.is_empty() || round != Round::default()).then(|| {
            Box::new(Life {
                options,
                round,
                expired: false,
            })
        })
    }
}

impl Job {
    /// The id clients know the job by: its name if it has one.
    pub fn id(&self) -> JobId {
        match &self.name {
            Some(name) => JobId::Client(name.clone()),
            None => JobId::Server(self.key),
        }
    }

    /// What a reserve or a peek hands out (the body is shared, not copied).
    pub fn body(&self) -> JobBody {
        JobBody {
            id: self.id(),
            tube: self.tube.clone(),
            body: Bytes::copy_from_slice(&self.body),
        }
    }

    /// What a log keeps of the job's changing part.
    pub fn meta(&self) -> Meta {
        Meta {
            key: self.key,
            pri: self.pri,
            delay: self.delay,
            state: self.state.stored(),
            counters: self.counters,
            round: self.life.as_ref().map_or(Round::default(), |l| l.round),
        }
    }

    /// Its options (all unset for most jobs).
    pub fn options(&self) -> Lifecycle {
        self.life
            .as_ref()
            .map_or(Lifecycle::default(), |l| l.options)
    }

    /// Reserves in this round.
    pub fn tries(&self) -> u32 {
        let start = self.life.as_ref().map_or(0, |l| l.round.start);
        self.counters.reserves.saturating_sub(start)
    }

    /// Uncounts the latest try, for a reserve that ended through no fault
    /// of the job's (see [`Round::given_back`]); false if it has no tries
    /// to count (no options).
    pub fn give_back_try(&mut self) -> bool {
        match &mut self.life {
            Some(life) => {
                life.round = life.round.given_back(self.counters.reserves);
                true
            }
            None => false,
        }
    }

    /// Where it is in its tries, for `stats-job`, if it has options.
    pub fn life_stats(&self) -> Option<LifeStats> {
        self.life.as_ref().map(|l| LifeStats {
            options: l.options,
            tries: self.tries(),
            dead: l.round.dead,
        })
    }

    /// When its time to live runs out, if it has one.
    pub fn expiry(&self) -> Option<Micros> {
        let ttl = self.options().ttl?;
        Some(self.created.saturating_add(crate::clock::micros(ttl)))
    }

    /// Whether its time to live ran out while a worker held it.
    pub fn expired(&self) -> bool {
        self.life.as_ref().is_some_and(|l| l.expired)
    }

    /// Sets where it is in its tries.
    pub fn set_round(&mut self, round: Round) {
        match &mut self.life {
            Some(life) => life.round = round,
            None => self.life = Life::of(Lifecycle::default(), round),
        }
    }

    /// The whole job, as a log keeps it.
    pub fn image(&self) -> JobImage<'_> {
        JobImage {
            meta: self.meta(),
            name: self.name.as_deref(),
            tube: self.tube.as_str(),
            ttr: self.ttr,
            created: self.created,
            body: &self.body,
            options: self.options(),
        }
    }
}

/// A tube's jobs by state, and who uses and watches it.
#[derive(Default)]
pub(super) struct TubeState {
    /// (priority, key): the first entry is the next job to hand out.
    pub ready: BTreeSet<(u32, u64)>,
    /// (due, key).
    pub delayed: BTreeSet<(Micros, u64)>,
    /// (bury sequence, key): oldest burial first.
    pub buried: BTreeSet<(u64, u64)>,
    /// The due time this tube is listed under in `State::soonest`: the
    /// first of `delayed`, while it has any.
    pub(super) listed: Option<Micros>,
    pub urgent: u64,
    pub reserved: u64,
    pub total_jobs: u64,
    pub expired: u64,
    pub using: u64,
    pub watching: u64,
    pub cmd_delete: u64,
    pub cmd_pause: u64,
    /// The pause length and when it ends, while paused.
    pub pause: Option<(Micros, Micros)>,
    /// For its rate limit: the second of its last reserve, and the
    /// reserves in that second.
    pub window: (u64, u32),
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

    /// How many of the tube's jobs are in each state, for `stats-tube`.
    pub fn counts(&self) -> Counts {
        Counts {
            urgent: self.urgent,
            ready: self.ready.len() as u64,
            reserved: self.reserved,
            delayed: self.delayed.len() as u64,
            buried: self.buried.len() as u64,
        }
    }

    /// Whether the tube is paused at `now`.
    pub fn paused(&self, now: Micros) -> bool {
        matches!(self.pause, Some((_, until)) if until > now)
    }
}

/// An entry of a table that finds a job's slot by its key (or by its
/// client-chosen id): the slot, and 32 bits of the key's hash. Each
/// doubling of a table moves every entry, and without the hash kept it
/// looked at every job to hash it again (a cache miss each, in a pool of
/// millions). A pipelined batch of 1,000 puts held up by the doubling past
/// 917,504 jobs took 50 ms, 17 ms with the hash kept; with client ids
/// (both tables doubling), 120 ms, 30 ms with both keeping it, and the
/// server's memory for 1.1 million such jobs went from 329 to 307 MiB (the
/// id table held a copy of each id's pointer). The doublings took a
/// seventh of the time of a restart with a million jobs in a profile; 4 %
/// of the restart's time went, in alternated runs. A lookup's check of the
/// hash also saves a look at the job for each entry in its group that is
/// not the one sought.
#[derive(Clone, Copy)]
struct Slotted {
    slot: u32,
    hash: u32,
}

impl Slotted {
    /// The 64-bit hash the table asks for, made of the 32 bits kept:
    /// the table takes a bucket from the low bits and a tag from the top
    /// seven, so both halves carry them all.
    fn spread(hash: u32) -> u64 {
        (u64::from(hash) << 32) | u64::from(hash)
    }
}

/// Everything the embedded engine holds.
pub struct State {
    pub(super) next_key: u64,
    /// The job pool.
    pub(super) jobs: Slab<Job>,
    /// The slot of every job, found by its key: the table holds the slot
    /// and the key's hash (see [`Slotted`]); the key is read from the job.
    slots: HashTable<Slotted>,
    hasher: DefaultHashBuilder,
    /// The slot of every job with a client-chosen id, found by the id: as
    /// `slots`, the table holds the slot and the id's hash, and the id is
    /// read from the job.
    names: HashTable<Slotted>,
    /// In creation order, which `list-tubes` reports.
    pub(super) tubes: IndexMap<Tube, TubeState>,
    /// Tubes removed from `tubes`, ever.
    pub(super) tubes_gone: u64,
    /// `tubes` as `list-tubes` lists them, with the count of tubes and of
    /// `tubes_gone` it was listed at (see `State::list_tubes`).
    pub(super) tubes_listed: Mutex<Option<((usize, u64), TubeList)>>,
    /// Every tube with delayed jobs, by the due time of its first one: the
    /// timer looks at the first entry only.
    pub(super) soonest: BTreeSet<(Micros, Tube)>,
    /// All reserved jobs, (deadline, key), for the timer, and who holds
    /// each. Holders live here rather than in every job record, which they
    /// would make 8 bytes bigger; reserved jobs are few.
    pub(super) reserved: BTreeMap<(Micros, u64), ConnId>,
    /// Paused tubes, (unpause time, tube), for the timer.
    pub(super) pauses: BTreeSet<(Micros, Tube)>,
    /// Tubes that went with a pause on them since the last transition's
    /// records were taken: their pause ends in the log too (see
    /// [`State::note_unpaused`]).
    pub(super) unpaused: Vec<Tube>,
    /// Jobs with a time to live, (when it runs out, key), for the timer;
    /// one held by a worker when it ran out leaves here, and goes when it
    /// is let go of.
    pub(super) expiries: BTreeSet<(Micros, u64)>,
    pub(super) expired: u64,
    /// Client ids of gone jobs kept taken (their unique window), until when;
    /// and the same by time, for the timer to let them go.
    pub(super) taken: HashMap<Arc<str>, Micros>,
    pub(super) taken_until: BTreeSet<(Micros, Arc<str>)>,
    /// The earliest end of a unique window begun since the store last
    /// passed it on to the timer, which must wake then to free the id: the
    /// delete or finish that began it does not say so.
    pub(super) window_begun: Option<Micros>,
    /// Tubes whose rate held a reserve back, by when the next second
    /// begins: the timer serves their waiting workers then.
    pub(crate) limited: BTreeSet<(Micros, Tube)>,
    pub(super) bury_seq: u64,
    /// For imports that keep their server ids: the highest key an import
    /// kept since this process started, and the highest a put may have
    /// handed out (see `State::import`).
    pub(super) imported: u64,
    pub(super) import_floor: u64,
    /// Tubes' settings, kept whether or not the tube exists.
    pub(super) settings: HashMap<Tube, Lifecycle>,
    /// `settings` as an export lists them, once one has asked, until they
    /// next change.
    pub(super) settings_listed: OnceLock<TubeSettings>,
    /// Schedules by name, as [`crate::schedule::Schedule::encode`] made
    /// them: the engine keeps them, the broker fires them.
    pub(super) schedules: BTreeMap<Arc<str>, Bytes>,
    pub(super) total_jobs: u64,
    pub(super) timeouts: u64,
    /// Set while a log is replayed: jobs are kept in the pool with their
    /// state, but the indexes by state (and by expiry) are built once, at
    /// the end ([`State::index_replayed`]). A million delayed jobs read
    /// back one at a time into ordered sets cost a third of a restart
    /// (random inserts, each a walk of cold tree nodes); sorted and built
    /// in one go they cost a small part of that.
    pub(super) replay: Option<Replay>,
}

/// What a replay keeps while it runs.
#[derive(Default)]
pub(super) struct Replay {
    /// The tube of the last job read back and its place in `tubes` (no
    /// tube goes while replaying, so the place holds). Jobs come in runs
    /// of one tube, and looking its name up took a tenth of a restart.
    pub last_tube: Option<(usize, Tube)>,
}

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}

impl State {
    /// An empty state holding only the `default` tube.
    pub fn new() -> State {
        let mut tubes = IndexMap::new();
        tubes.insert(Tube::default_tube(), TubeState::default());
        State {
            next_key: 1,
            jobs: Slab::new(),
            slots: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            names: HashTable::new(),
            tubes,
            tubes_gone: 0,
            tubes_listed: Mutex::new(None),
            soonest: BTreeSet::new(),
            reserved: BTreeMap::new(),
            pauses: BTreeSet::new(),
            unpaused: Vec::new(),
            expiries: BTreeSet::new(),
            expired: 0,
            taken: HashMap::new(),
            taken_until: BTreeSet::new(),
            window_begun: None,
            limited: BTreeSet::new(),
            bury_seq: 0,
            imported: 0,
            import_floor: 0,
            settings: HashMap::new(),
            settings_listed: OnceLock::new(),
            schedules: BTreeMap::new(),
            total_jobs: 0,
            timeouts: 0,
            replay: None,
        }
    }

    /// The key's hash, in the 32 bits a [`Slotted`] keeps of it.
    fn hash(&self, key: u64) -> u32 {
        // The low half: the hasher mixes every bit of the key into it.
        self.hasher.hash_one(key) as u32
    }

    /// The slot of the job with this key.
    pub(super) fn slot(&self, key: u64) -> Option<Slot> {
        let jobs = &self.jobs;
        let hash = self.hash(key);
        self.slots
            .find(Slotted::spread(hash), |s| {
                s.hash == hash && jobs[s.slot as usize].key == key
            })
            .map(|s| s.slot as Slot)
    }

    /// Where the job `id` names is, if it exists: a server id does not
    /// name a job that has a name of its own.
    pub(super) fn slot_of(&self, id: &JobId) -> Option<Slot> {
        match id {
            JobId::Server(n) => self.slot(*n).filter(|&s| self.jobs[s].name.is_none()),
            JobId::Client(name) => self.named(name),
        }
    }

    /// The hash of a client-chosen id, in the 32 bits a [`Slotted`] keeps.
    fn name_hash(&self, name: &str) -> u32 {
        self.hasher.hash_one(name) as u32
    }

    /// The slot of the job with this client-chosen id.
    pub(super) fn named(&self, name: &str) -> Option<Slot> {
        let jobs = &self.jobs;
        let hash = self.name_hash(name);
        self.names
            .find(Slotted::spread(hash), |s| {
                s.hash == hash && jobs[s.slot as usize].name.as_deref() == Some(name)
            })
            .map(|s| s.slot as Slot)
    }

    /// The slot of an indexed job.
    pub(super) fn indexed(&self, key: u64) -> Slot {
        self.slot(key).expect("an indexed job is in the pool")
    }

    /// Who holds the job in `slot`, if it is reserved.
    pub(super) fn holder(&self, slot: Slot) -> Option<ConnId> {
        let job = &self.jobs[slot];
        match job.state {
            St::Reserved { deadline } => self.reserved.get(&(deadline, job.key)).copied(),
            _ => None,
        }
    }

    /// The slot of a job that `conn` has reserved.
    pub(super) fn held_by(&self, conn: ConnId, id: &JobId) -> Option<Slot> {
        let slot = self.slot_of(id)?;
        (self.holder(slot) == Some(conn)).then_some(slot)
    }

    /// Adds a job to the pool (and its name to the names); its state is set
    /// by `link` straight after.
    pub(super) fn insert(&mut self, job: Job) -> Slot {
        let key = job.key;
        if let Some(at) = job.expiry().filter(|_| self.replay.is_none()) {
            self.expiries.insert((at, key));
        }
        let name_hash = job.name.as_deref().map(|name| self.name_hash(name));
        let slot = self.jobs.insert(job);
        let hash = self.hash(key);
        // A slab of more than 4 billion jobs would not fit in memory anyway.
        let slot32 = u32::try_from(slot).expect("fewer than 2^32 jobs");
        self.slots
            .insert_unique(Slotted::spread(hash), Slotted { slot: slot32, hash }, |s| {
                Slotted::spread(s.hash)
            });
        if let Some(hash) = name_hash {
            self.names
                .insert_unique(Slotted::spread(hash), Slotted { slot: slot32, hash }, |s| {
                    Slotted::spread(s.hash)
                });
        }
        slot
    }

    /// Takes an unlinked job out of the pool (and its name out of the names).
    fn take(&mut self, slot: Slot) -> Job {
        let key = self.jobs[slot].key;
        if let Some(at) = self.jobs[slot].expiry().filter(|_| self.replay.is_none()) {
            self.expiries.remove(&(at, key));
        }
        let hash = self.hash(key);
        if let Ok(entry) = self
            .slots
            .find_entry(Slotted::spread(hash), |s| s.slot as Slot == slot)
        {
            entry.remove();
        }
        if let Some(name) = self.jobs[slot].name.as_deref() {
            let hash = self.name_hash(name);
            if let Ok(entry) = self
                .names
                .find_entry(Slotted::spread(hash), |s| s.slot as Slot == slot)
            {
                entry.remove();
            }
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
    pub(super) fn unlink(&mut self, slot: Slot) {
        if self.replay.is_some() {
            return;
        }
        let job = &self.jobs[slot];
        let key = job.key;
        let ts = self.tubes.get_mut(&job.tube).expect("a job's tube exists");
        match job.state {
            St::Ready => {
                ts.ready.remove(&(job.pri, key));
                if is_urgent(job.pri) {
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
    pub(super) fn link(&mut self, slot: Slot, st: St, conn: ConnId) {
        let job = &mut self.jobs[slot];
        job.state = st;
        if self.replay.is_some() {
            return;
        }
        let key = job.key;
        let ts = self.tubes.get_mut(&job.tube).expect("a job's tube exists");
        match st {
            St::Ready => {
                ts.ready.insert((job.pri, key));
                if is_urgent(job.pri) {
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

    /// Moves a job to another state.
    pub(super) fn relink(&mut self, slot: Slot, st: St, conn: ConnId) {
        self.unlink(slot);
        self.link(slot, st, conn);
    }

    /// Removes a job altogether (a delete); returns it.
    pub(super) fn remove(&mut self, slot: Slot) -> Job {
        let job = self.discard(slot);
        if let Some(ts) = self.tubes.get_mut(&job.tube) {
            ts.cmd_delete += 1;
        }
        self.forget_if_unused(&job.tube);
        job
    }

    /// Removes a job whose time to live ran out, counting it; returns it.
    pub(super) fn expire(&mut self, slot: Slot) -> Job {
        let job = self.discard(slot);
        self.expired += 1;
        if let Some(ts) = self.tubes.get_mut(&job.tube) {
            ts.expired += 1;
        }
        self.forget_if_unused(&job.tube);
        job
    }

    /// Takes a job out of its index and the pool, counting nothing (a
    /// replay replacing or dropping it).
    pub(super) fn discard(&mut self, slot: Slot) -> Job {
        self.unlink(slot);
        self.take(slot)
    }

    /// Makes a job ready, noting its tube among those to serve.
    pub(super) fn make_ready(&mut self, slot: Slot, ready: &mut Vec<Tube>) {
        self.relink(slot, St::Ready, NO_CONN);
        let tube = &self.jobs[slot].tube;
        if !ready.contains(tube) {
            ready.push(tube.clone());
        }
    }

    /// Records the end of the pauses of tubes that went (see
    /// [`State::forget_if_unused`]). Without it a restart would replay the
    /// pause and bring it back, on the tube's next jobs, long after it went.
    pub(super) fn note_unpaused(&mut self, log: &mut impl Journal) {
        for tube in self.unpaused.drain(..) {
            log.note(Record::Pause {
                tube: tube.as_str(),
                length: 0,
                until: 0,
            });
        }
    }

    /// A tube exists while it is used, watched or holds jobs; `default` always;
    /// a pause goes with it.
    pub(super) fn forget_if_unused(&mut self, tube: &Tube) {
        // While replaying, the indexes that tell whether a tube holds jobs
        // are not built yet; the end of the replay forgets what is unused.
        if tube.as_str() == "default" || self.replay.is_some() {
            return;
        }
        if let Some(ts) = self.tubes.get(tube).filter(|ts| ts.unused()) {
            if let Some((_, until)) = ts.pause {
                self.pauses.remove(&(until, tube.clone()));
                self.unpaused.push(tube.clone());
            }
            // The last tube takes its place in `list-tubes`, as in
            // beanstalkd; shifting every later tube down made a connection
            // that watched tens of thousands of tubes stop the server for
            // seconds as it closed.
            self.tubes.swap_remove(tube);
            self.tubes_gone += 1;
        }
    }
}
