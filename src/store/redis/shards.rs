//! Shards: on a cluster, a tube's jobs are spread over many hash slots, so
//! one busy tube uses every primary, while each transition stays one call in
//! one slot.
//!
//! * There are [`SHARDS`] shards, fixed forever: shard `k`'s keys carry a
//!   hash tag whose slot lies in the `k`-th of [`SHARDS`] equal ranges of the
//!   16,384 slots, so however a cluster divides its slots into ranges among
//!   its primaries, each holds its share of the shards.
//! * A job's shard follows from its id alone: a server id is the shard's
//!   own sequence number times [`SHARDS`] plus the shard; a client-chosen id
//!   lives in the shard of its slot (the slot Redis would give the id as a
//!   key, so `{...}` in an id groups ids as it groups keys). Uniqueness of a
//!   client id is checked in that shard, atomically.
//! * How many shards a tube's new jobs go to (`--shards`) can change at any
//!   time: it only decides where new jobs go, never where a job is found.
//! * The cluster's control slot (the prefix's own tag, as on one Redis) holds
//!   what is not a job's: the processes alive, the tubes' users, pauses.
//! * Each shard is ticked by one live process, chosen by rendezvous hashing,
//!   so the work is divided and a dead process's shards pass to the others
//!   as soon as its alive mark expires.
//! * Reserve looks where hints say a tube has ready jobs: what this process
//!   put or moved itself, and what the shards announce on their channels.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::names::{JobId, Tube};

/// Shards of a cluster deployment. Fixed: a server id says its shard as its
/// remainder by this number.
pub const SHARDS: usize = 64;
/// Shards a tube's new jobs spread over unless `--shards` says otherwise.
pub const DEFAULT_SPREAD: usize = SHARDS;
/// Slots in a Redis Cluster.
const SLOTS: usize = 16_384;

/// The slot Redis gives `key`: CRC16 of its hash tag (the text between the
/// first `{` and the next `}`, if not empty), or of the whole key.
pub fn slot(key: &[u8]) -> usize {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    usize::from(crc16::State::<crc16::XMODEM>::calculate(hashed)) % SLOTS
}

/// The shard whose slots hold `slot`.
fn shard_of_slot(slot: usize) -> usize {
    slot * SHARDS / SLOTS
}

/// Shard `k`'s hash tag, `{PREFIX-k.n}` with the least `n` whose slot lies
/// in the shard's range: the same in every process, found in microseconds.
fn shard_tag(prefix: &str, k: usize) -> String {
    (0u32..)
        .map(|n| format!("{{{prefix}-{k}.{n}}}"))
        .find(|tag| shard_of_slot(slot(tag.as_bytes())) == k)
        .expect("some n gives a slot in every range")
}

/// When a shard next needs its tick, as far as this process knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Not known (never ticked, or its news may have been missed).
    Unknown,
    At(Instant),
    Never,
}

/// The keys' layout, and what this process knows of the shards.
pub(super) struct Sharding {
    /// Every shard's hash tag, then the control slot's.
    pub tags: Vec<String>,
    /// How many shards a tube's new server-id jobs spread over.
    spread: usize,
    /// Tubes whose jobs all stay on one shard, for strict order.
    whole: Vec<String>,
    /// Spreads server-id puts.
    turn: AtomicUsize,
    /// Per tube, the shards that may have ready jobs, each with the number
    /// of the hint (a reserve that found nothing clears only the hint it
    /// saw, never a newer one).
    hints: Mutex<HashMap<Tube, Vec<u64>>>,
    hint_seq: AtomicU64,
    due: Mutex<Vec<Due>>,
    /// The live processes, as the control slot last said.
    live: Mutex<Vec<String>>,
    /// Paused tubes and when their pause ends.
    pauses: Mutex<HashMap<Tube, Instant>>,
    /// The shards' news may have been missed: hints are to be rebuilt.
    pub rescan: AtomicBool,
    /// Spreads where reserves start looking.
    start: AtomicUsize,
}

impl Sharding {
    /// The layout of a cluster deployment under `prefix`.
    pub fn new(prefix: &str, spread: usize, whole: Vec<String>) -> Sharding {
        let mut tags: Vec<String> = (0..SHARDS).map(|k| shard_tag(prefix, k)).collect();
        tags.push(format!("{{{prefix}}}"));
        Sharding {
            tags,
            spread: spread.clamp(1, SHARDS),
            whole,
            turn: AtomicUsize::new(0),
            hints: Mutex::new(HashMap::new()),
            hint_seq: AtomicU64::new(0),
            due: Mutex::new(vec![Due::Unknown; SHARDS]),
            live: Mutex::new(Vec::new()),
            pauses: Mutex::new(HashMap::new()),
            rescan: AtomicBool::new(true),
            start: AtomicUsize::new(0),
        }
    }

    /// The control slot's index among the tags.
    #[cfg(test)]
    pub fn control(&self) -> usize {
        SHARDS
    }

    /// The shard a new job of `tube` goes to.
    pub fn shard_for_put(&self, tube: &Tube, id: Option<&str>) -> usize {
        if let Some(name) = id {
            return shard_of_slot(slot(name.as_bytes()));
        }
        let home = shard_of_slot(slot(tube.as_str().as_bytes()));
        if self.spread == 1 || self.whole.iter().any(|t| t == tube.as_str()) {
            return home;
        }
        // The tube's shards lie evenly spaced from its home, so a tube
        // spread over fewer shards than there are still reaches every
        // primary.
        let i = self.turn.fetch_add(1, Ordering::Relaxed) % self.spread;
        (home + i * SHARDS / self.spread) % SHARDS
    }

    /// A job's shard and its id as that shard knows it.
    pub fn locate(&self, id: &JobId) -> (usize, JobId) {
        match id {
            JobId::Server(n) => (
                (*n % SHARDS as u64) as usize,
                JobId::Server(*n / SHARDS as u64),
            ),
            JobId::Client(name) => (shard_of_slot(slot(name.as_bytes())), id.clone()),
        }
    }

    /// A job id a shard returned, as clients know it.
    pub fn global(shard: usize, id: JobId) -> JobId {
        match id {
            JobId::Server(n) => JobId::Server(n * SHARDS as u64 + shard as u64),
            client => client,
        }
    }

    /// `tube` may have ready jobs in `shard`.
    pub fn hint(&self, tube: &Tube, shard: usize) {
        let seq = self.hint_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut hints = self.hints.lock().unwrap_or_else(PoisonError::into_inner);
        match hints.get_mut(tube) {
            Some(shards) => shards[shard] = seq,
            None => {
                let mut shards = vec![0; SHARDS];
                shards[shard] = seq;
                hints.insert(tube.clone(), shards);
            }
        }
    }

    /// Where to look for a ready job of `tubes`: each shard with hints, the
    /// hinted tubes there and the hints' numbers, starting at a shard that
    /// moves on with every call, so concurrent reserves spread out.
    pub fn candidates(&self, tubes: &[Tube]) -> Vec<(usize, Vec<(Tube, u64)>)> {
        let now = Instant::now();
        let paused: Vec<Tube> = {
            let pauses = self.pauses.lock().unwrap_or_else(PoisonError::into_inner);
            tubes
                .iter()
                .filter(|t| pauses.get(*t).is_some_and(|&until| until > now))
                .cloned()
                .collect()
        };
        let hints = self.hints.lock().unwrap_or_else(PoisonError::into_inner);
        let start = self.start.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::new();
        for i in 0..SHARDS {
            let shard = (start + i) % SHARDS;
            let here: Vec<(Tube, u64)> = tubes
                .iter()
                .filter(|t| !paused.contains(t))
                .filter_map(|t| {
                    let seq = hints.get(t)?[shard];
                    (seq > 0).then(|| (t.clone(), seq))
                })
                .collect();
            if !here.is_empty() {
                out.push((shard, here));
            }
        }
        out
    }

    /// A reserve in `shard` found none of `seen` ready: forgets those hints,
    /// unless a newer one came meanwhile.
    pub fn unhint(&self, shard: usize, seen: &[(Tube, u64)]) {
        let mut hints = self.hints.lock().unwrap_or_else(PoisonError::into_inner);
        for (tube, seq) in seen {
            if let Some(shards) = hints.get_mut(tube) {
                if shards[shard] == *seq {
                    shards[shard] = 0;
                }
                if shards.iter().all(|&s| s == 0) {
                    hints.remove(tube);
                }
            }
        }
    }

    /// `shard` has something due at `at` (or earlier).
    pub fn due_at(&self, shard: usize, at: Instant) {
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        due[shard] = match due[shard] {
            Due::At(t) if t <= at => Due::At(t),
            Due::Unknown => Due::Unknown,
            _ => Due::At(at),
        };
    }

    /// A tick of `shard` found the next due time `next` from `now`.
    pub fn ticked(&self, shard: usize, next: Option<Instant>) {
        self.due.lock().unwrap_or_else(PoisonError::into_inner)[shard] = match next {
            Some(at) => Due::At(at),
            None => Due::Never,
        };
    }

    /// Every shard's news may have been missed.
    pub fn forget_all(&self) {
        self.due
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fill(Due::Unknown);
        self.rescan.store(true, Ordering::Release);
    }

    /// The live processes are now `live`; shards that pass to `me` are
    /// ticked at once (their owner may have died with something due).
    pub fn set_live(&self, me: &str, live: Vec<String>) {
        let mut old = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if *old == live {
            return;
        }
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        for (shard, due) in due.iter_mut().enumerate() {
            if owner(&live, shard) == Some(me) && owner(&old, shard) != Some(me) {
                *due = Due::Unknown;
            }
        }
        *old = live;
    }

    /// The shards this process ticks that are due by `now`, and the time of
    /// the earliest one that is not.
    pub fn to_tick(&self, me: &str, now: Instant) -> (Vec<usize>, Option<Instant>) {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ready = Vec::new();
        let mut next: Option<Instant> = None;
        for (shard, due) in due.iter().enumerate() {
            // Until the first heartbeat names the live processes, this one
            // ticks every shard.
            if !live.is_empty() && owner(&live, shard) != Some(me) {
                continue;
            }
            match *due {
                Due::Unknown => ready.push(shard),
                Due::At(at) if at <= now => ready.push(shard),
                Due::At(at) => next = Some(next.map_or(at, |n| n.min(at))),
                Due::Never => {}
            }
        }
        (ready, next)
    }

    /// The pauses are now `pauses` (tube, end); returns the tubes whose
    /// pause this process knew of and that have ended.
    pub fn set_pauses(&self, pauses: Vec<(Tube, Instant)>) -> Vec<Tube> {
        let mut known = self.pauses.lock().unwrap_or_else(PoisonError::into_inner);
        let ended: Vec<Tube> = known
            .keys()
            .filter(|t| !pauses.iter().any(|(p, _)| p == *t))
            .cloned()
            .collect();
        *known = pauses.into_iter().collect();
        ended
    }

    /// One pause set or lifted by this process.
    pub fn pause(&self, tube: &Tube, until: Option<Instant>) {
        let mut known = self.pauses.lock().unwrap_or_else(PoisonError::into_inner);
        match until {
            Some(at) => known.insert(tube.clone(), at),
            None => known.remove(tube),
        };
    }

    /// Pauses that have ended by `now` (forgotten), and the next end.
    pub fn pauses_ended(&self, now: Instant) -> (Vec<Tube>, Option<Instant>) {
        let mut known = self.pauses.lock().unwrap_or_else(PoisonError::into_inner);
        let ended: Vec<Tube> = known
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(t, _)| t.clone())
            .collect();
        for t in &ended {
            known.remove(t);
        }
        (ended, known.values().min().copied())
    }
}

/// The live process that ticks `shard`: the one whose hash with the shard
/// is highest, so when a process comes or goes only its shards move.
fn owner(live: &[String], shard: usize) -> Option<&str> {
    // CRC-32C, not std's hasher: every process, whatever it was built
    // with, must reach the same answer.
    live.iter()
        .max_by_key(|p| crc32c::crc32c_append(crc32c::crc32c(p.as_bytes()), &shard.to_le_bytes()))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_redis_gives() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"{}x"), slot(b"{}x"));
    }

    #[test]
    fn every_shard_tag_lies_in_its_own_range() {
        let s = Sharding::new("delayq:", SHARDS, Vec::new());
        for (k, tag) in s.tags[..SHARDS].iter().enumerate() {
            assert_eq!(shard_of_slot(slot(tag.as_bytes())), k, "{tag}");
            assert_eq!(slot(format!("{tag}jobs").as_bytes()), slot(tag.as_bytes()));
        }
        assert_eq!(s.tags[s.control()], "{delayq:}");
    }

    #[test]
    fn ids_name_their_shard() {
        let s = Sharding::new("delayq:", SHARDS, Vec::new());
        for shard in [0, 1, 63] {
            let id = Sharding::global(shard, JobId::Server(12345));
            assert_eq!(s.locate(&id), (shard, JobId::Server(12345)));
        }
        let name = JobId::parse(b"order-close:4711").unwrap();
        let tube = Tube::parse(b"t").unwrap();
        let (shard, local) = s.locate(&name);
        assert_eq!(local, name);
        assert_eq!(s.shard_for_put(&tube, Some("order-close:4711")), shard);
    }

    #[test]
    fn puts_spread_evenly_and_whole_tubes_stay_home() {
        let s = Sharding::new("delayq:", 16, vec!["fifo".into()]);
        let orders = Tube::parse(b"orders").unwrap();
        let mut seen = vec![0; SHARDS];
        for _ in 0..1600 {
            seen[s.shard_for_put(&orders, None)] += 1;
        }
        assert_eq!(seen.iter().filter(|&&n| n == 100).count(), 16);
        let fifo = Tube::parse(b"fifo").unwrap();
        let home = s.shard_for_put(&fifo, None);
        assert!((0..100).all(|_| s.shard_for_put(&fifo, None) == home));
    }

    #[test]
    fn a_hint_seen_empty_is_cleared_but_not_a_newer_one() {
        let s = Sharding::new("p", SHARDS, Vec::new());
        let t = Tube::parse(b"t").unwrap();
        s.hint(&t, 5);
        let c = s.candidates(std::slice::from_ref(&t));
        assert_eq!(c.len(), 1);
        s.hint(&t, 5);
        s.unhint(5, &c[0].1);
        assert_eq!(s.candidates(std::slice::from_ref(&t)).len(), 1);
        let c = s.candidates(std::slice::from_ref(&t));
        s.unhint(5, &c[0].1);
        assert!(s.candidates(&[t]).is_empty());
    }

    #[test]
    fn shards_are_divided_among_the_live() {
        let live: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let mut per = HashMap::new();
        for shard in 0..SHARDS {
            *per.entry(owner(&live, shard).unwrap()).or_insert(0) += 1;
        }
        assert_eq!(per.len(), 3);
        // Without "b", only b's shards move.
        let fewer: Vec<String> = ["a", "c"].map(String::from).to_vec();
        for shard in 0..SHARDS {
            let before = owner(&live, shard).unwrap();
            if before != "b" {
                assert_eq!(owner(&fewer, shard), Some(before));
            }
        }
    }
}
