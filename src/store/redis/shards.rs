//! Shards: on a cluster, a tube's jobs are spread over many hash slots, so
//! one busy tube uses every primary, while each transition stays one call in
//! one slot.
//!
//! * There are [`SHARDS`] shards, fixed forever: shard `k`'s keys carry a
//!   hash tag whose slot lies in the `k`-th of [`SHARDS`] equal ranges of the
//!   16,384 slots, so however a cluster divides its slots into ranges among
//!   its primaries, each holds its share of the shards.
//! * Job keys come from one cluster-wide sequence in the control slot,
//!   handed to each process in blocks, so server ids count up from 1 in the
//!   order of the puts, as on beanstalkd, and keys of all shards compare.
//! * A job's shard follows from its id alone: a server id's shard is its
//!   remainder by [`SHARDS`]; a client-chosen id lives in the shard of its
//!   slot (the slot Redis would give the id as a key). Uniqueness of a
//!   client id is checked in that shard, atomically.
//! * How many shards a tube's new jobs go to (`--shards`: all 64 by
//!   default, or a number, or one per primary) can change at any time: it
//!   only decides which keys new jobs get, never where a job is found. Fewer
//!   than 64 are chosen evenly among the primaries that serve them, as the
//!   cluster's slot map says: every call carries the commands of one shard
//!   only, so the fewer a tube's shards, the more commands share a call, and
//!   one per primary still spreads a busy tube over all of them. (The keys
//!   of the other shards are skipped, so server ids then skip too.)
//! * The cluster's control slot (the prefix's own tag, as on one Redis) holds
//!   what is not a job's: the key sequence, the processes alive, the tubes'
//!   users, pauses.
//! * Each shard is ticked by one live process, chosen by rendezvous hashing,
//!   so the work is divided and a dead process's shards pass to the others
//!   as soon as its alive mark expires.
//! * Every call to a shard answers, besides its results, the first ready
//!   job (priority, key) of each tube it changed, and a shard announces the
//!   first ready job of a tube that got one on its channel. From these each
//!   process knows each shard's most urgent, oldest ready job per tube, and
//!   a reserve takes the best of all shards: one call, in one shard. With
//!   one delayq process that is exactly beanstalkd's order; with several,
//!   news of another's moves can lag a call behind, and a reserve may then
//!   take a job a little out of order.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::names::{JobId, Tube};

/// Shards of a cluster deployment. Fixed: a server id says its shard as its
/// remainder by this number.
pub const SHARDS: usize = 64;

/// Every shard, as a set of bits (see `Sharding::rescan`).
pub const ALL_SHARDS: u64 = u64::MAX >> (64 - SHARDS);
/// Slots in a Redis Cluster.
const SLOTS: usize = 16_384;
/// How long (µs of Redis time) a shard's "no ready jobs" is kept, to outweigh
/// announcements older than it that arrive after it.
const STALE_US: u64 = 10_000_000;

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

/// The shard a client-chosen id's job lives in: the one whose range holds
/// the slot Redis would give the id as a key.
pub fn shard_of_key(key: &[u8]) -> usize {
    shard_of_slot(slot(key))
}

/// Shard `k`'s hash tag, `{PREFIX-k.n}` with the least `n` whose slot lies
/// in the shard's range: the same in every process, found in microseconds.
pub fn shard_tag(prefix: &str, k: usize) -> String {
    (0u32..)
        .map(|n| format!("{{{prefix}-{k}.{n}}}"))
        .find(|tag| shard_of_slot(slot(tag.as_bytes())) == k)
        .expect("some n gives a slot in every range")
}

/// The shard of `mask` that comes after `last`, going round the 64.
pub fn after(mask: u64, last: usize) -> usize {
    let above = match last {
        l if l + 1 >= SHARDS => 0,
        l => mask & (u64::MAX << (l + 1)),
    };
    let from = if above == 0 { mask } else { above };
    from.trailing_zeros() as usize % SHARDS
}

/// The first key at or after `from` whose shard is `shard`.
pub fn key_at_or_after(from: u64, shard: usize) -> u64 {
    let n = SHARDS as u64;
    from + (shard as u64 + n - from % n) % n
}

/// `spread` shards beginning at `home`: with the shards' primaries known,
/// taken from each primary in turn (a round of one shard from every primary,
/// each the next of its shards counting from `home`, primaries in the order
/// their first shard comes), so that they are even over the primaries;
/// otherwise evenly spaced around the 64, which a cluster whose slots are
/// split into equal ranges also spreads nearly evenly.
fn choose(home: usize, spread: usize, primaries: Option<&[usize]>) -> u64 {
    if spread >= SHARDS {
        return u64::MAX;
    }
    let order = (0..SHARDS).map(|i| (home + i) % SHARDS);
    let Some(primaries) = primaries else {
        let stride = SHARDS / spread.max(1);
        return order
            .step_by(stride)
            .take(spread)
            .fold(0, |m, k| m | 1 << k);
    };
    // Each shard's place: its round (how many shards of its primary come
    // before it), then its primary's place among the primaries.
    let mut seen = [0usize; SHARDS];
    let mut first = [usize::MAX; SHARDS];
    let mut places = [(0usize, 0usize, 0usize); SHARDS];
    let mut primaries_seen = 0;
    for (i, k) in order.enumerate() {
        let p = primaries
            .get(k)
            .copied()
            .unwrap_or_default()
            .min(SHARDS - 1);
        if first[p] == usize::MAX {
            first[p] = primaries_seen;
            primaries_seen += 1;
        }
        places[i] = (seen[p], first[p], k);
        seen[p] += 1;
    }
    places.sort_unstable();
    places[..spread].iter().fold(0, |m, &(_, _, k)| m | 1 << k)
}

/// When a shard next needs its tick, as far as this process knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Not known (never ticked, or its news may have been missed).
    Unknown,
    At(Instant),
    Never,
}

/// A shard's first ready job of a tube, as of `at` (the Redis time of the
/// call or announcement that said so, in µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    at: u64,
    /// Priority and key; `None` once the shard said it has none.
    first: Option<(u64, u64)>,
}

/// The keys' layout, and what this process knows of the shards.
pub(super) struct Sharding {
    /// Every shard's hash tag, then the control slot's.
    pub tags: Vec<String>,
    /// How many shards a tube's new server-id jobs spread over; `None`: one
    /// per primary.
    spread: Option<usize>,
    /// Per shard, the primary serving it (an index among the primaries), as
    /// the cluster's slot map last said; `None` until it is known.
    primaries: Mutex<Option<Vec<usize>>>,
    /// Tubes whose jobs all stay on one shard, for strict order.
    whole: Vec<String>,
    /// Per tube, per shard with ready jobs, the first of them.
    heads: Mutex<HashMap<Tube, HashMap<usize, Head>>>,
    /// Per shard, when it is due, and how many times news changed that (a
    /// tick's answer must not undo news that came while it ran).
    due: Mutex<Vec<(Due, u64)>>,
    /// The live processes, as the control slot last said.
    live: Mutex<Vec<String>>,
    /// Paused tubes and when their pause ends.
    pauses: Mutex<HashMap<Tube, Instant>>,
    /// The shards whose news may have been missed (bit `k` for shard `k`):
    /// their heads are to be learnt again.
    pub rescan: AtomicU64,
    /// Reserves under way, per shard and tube.
    claims: Mutex<HashMap<(usize, Tube), usize>>,
}

/// A reserve under way in one shard for one tube; let go when dropped.
pub(super) struct Claim<'a> {
    sharding: &'a Sharding,
    target: (usize, Tube),
}

impl Claim<'_> {
    /// The shard and tube claimed.
    pub fn target(&self) -> &(usize, Tube) {
        &self.target
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut claims = self
            .sharding
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = claims.get_mut(&self.target) {
            *n -= 1;
            if *n == 0 {
                claims.remove(&self.target);
            }
        }
    }
}

impl Sharding {
    /// The layout of a cluster deployment under `prefix`.
    /// `spread`: how many shards a tube's new jobs go to, `None` for one per
    /// primary.
    pub fn new(prefix: &str, spread: Option<usize>, whole: Vec<String>) -> Sharding {
        let mut tags: Vec<String> = (0..SHARDS).map(|k| shard_tag(prefix, k)).collect();
        tags.push(format!("{{{prefix}}}"));
        Sharding {
            tags,
            spread: spread.map(|n| n.clamp(1, SHARDS)),
            primaries: Mutex::new(None),
            whole,
            heads: Mutex::new(HashMap::new()),
            due: Mutex::new(vec![(Due::Unknown, 0); SHARDS]),
            live: Mutex::new(Vec::new()),
            pauses: Mutex::new(HashMap::new()),
            rescan: AtomicU64::new(ALL_SHARDS),
            claims: Mutex::new(HashMap::new()),
        }
    }

    /// Claims the first of `candidates` (best first) that no other reserve
    /// is after, or the first if all are.
    pub fn claim(&self, candidates: &[(usize, Tube)]) -> Option<Claim<'_>> {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let target = candidates
            .iter()
            .find(|c| !claims.contains_key(*c))
            .or_else(|| candidates.first())?
            .clone();
        *claims.entry(target.clone()).or_default() += 1;
        Some(Claim {
            sharding: self,
            target,
        })
    }

    /// Learns which primary serves each shard: `primaries[k]` names shard
    /// `k`'s (any name that tells primaries apart). True if that changed.
    pub fn set_primaries(&self, primaries: &[String]) -> bool {
        let mut names: Vec<&String> = primaries.iter().collect();
        names.sort();
        names.dedup();
        let index: Vec<usize> = primaries
            .iter()
            .map(|p| names.binary_search(&p).unwrap_or_default())
            .collect();
        let mut known = self
            .primaries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if known.as_ref() == Some(&index) {
            return false;
        }
        *known = Some(index);
        true
    }

    /// Whether tubes spread over fewer than all the shards, chosen by the
    /// slot map.
    pub fn chooses(&self) -> bool {
        self.spread.is_none_or(|n| n < SHARDS)
    }

    /// How many shards `tube`'s jobs are spread over.
    pub fn spread_of(&self, tube: &Tube) -> usize {
        let primaries = self
            .primaries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.spread_with(tube, primaries.as_deref())
    }

    fn spread_with(&self, tube: &Tube, primaries: Option<&[usize]>) -> usize {
        if self.whole.iter().any(|t| t == tube.as_str()) {
            return 1;
        }
        match (self.spread, primaries) {
            (Some(n), _) => n,
            (None, Some(p)) => p.iter().max().map_or(SHARDS, |&most| most + 1),
            // Until the slot map is known, every shard: the spread is even
            // whatever the layout.
            (None, None) => SHARDS,
        }
    }

    /// The shards new jobs of `tube` go to, as a mask (bit `k`: shard `k`):
    /// taken in turn from each primary, beginning with the tube's home shard
    /// (the one its name hashes to) and going round, so that each primary
    /// serves as many of them as another, give or take one, and tubes with
    /// different homes use different shards.
    pub fn mask(&self, tube: &Tube) -> u64 {
        let primaries = self
            .primaries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let spread = self.spread_with(tube, primaries.as_deref());
        let home = shard_of_slot(slot(tube.as_str().as_bytes()));
        choose(home, spread, primaries.as_deref())
    }

    /// A job's shard.
    pub fn locate(&self, id: &JobId) -> usize {
        match id {
            JobId::Server(n) => (*n % SHARDS as u64) as usize,
            JobId::Client(name) => shard_of_key(name.as_bytes()),
        }
    }

    /// News of `shard` as of `at`: the first ready job of `tube` there is
    /// `first` (priority, key), or there is none. Older news than what is
    /// known is ignored.
    pub fn head(&self, shard: usize, at: u64, tube: &Tube, first: Option<(u64, u64)>) {
        let mut heads = self.heads.lock().unwrap_or_else(PoisonError::into_inner);
        let known = heads.entry(tube.clone()).or_default();
        if known.get(&shard).is_some_and(|h| h.at > at) {
            return;
        }
        known.insert(shard, Head { at, first });
        if first.is_none() {
            known.retain(|_, h| h.first.is_some() || h.at + STALE_US > at);
            if known.is_empty() {
                heads.remove(tube);
            }
        }
    }

    /// A shard's call's news, `{time, tube, pri, key, ...}` (pri -1: none).
    pub fn heads(&self, shard: usize, v: Vec<redis::Value>) -> Option<()> {
        let mut v = v.into_iter();
        let at: u64 = redis::from_redis_value(v.next()?).ok()?;
        while let (Some(t), Some(pri), Some(key)) = (v.next(), v.next(), v.next()) {
            let t: String = redis::from_redis_value(t).ok()?;
            let pri: i64 = redis::from_redis_value(pri).ok()?;
            let key: String = redis::from_redis_value(key).ok()?;
            let first = match (u64::try_from(pri), u64::from_str_radix(&key, 16)) {
                (Ok(pri), Ok(key)) => Some((pri, key)),
                _ => None,
            };
            self.head(shard, at, &Tube::parse(t.as_bytes())?, first);
        }
        Some(())
    }

    /// Where the next ready job of `tubes` is, best first: (priority, key,
    /// shard, tube) of each shard's first, leaving out paused tubes.
    pub fn candidates(&self, tubes: &[Tube]) -> Vec<(u64, u64, usize, Tube)> {
        let now = Instant::now();
        let pauses = self.pauses.lock().unwrap_or_else(PoisonError::into_inner);
        let heads = self.heads.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        for t in tubes {
            if pauses.get(t).is_some_and(|&until| until > now) {
                continue;
            }
            for (&shard, h) in heads.get(t).into_iter().flatten() {
                if let Some((pri, key)) = h.first {
                    out.push((pri, key, shard, t.clone()));
                }
            }
        }
        out.sort_unstable_by_key(|c| (c.0, c.1, c.2));
        out
    }

    /// `shard` has something due at `at` (or earlier).
    pub fn due_at(&self, shard: usize, at: Instant) {
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let (when, news) = &mut due[shard];
        *news += 1;
        *when = match *when {
            Due::At(t) if t <= at => Due::At(t),
            Due::Unknown => Due::Unknown,
            _ => Due::At(at),
        };
    }

    /// A tick of `shard`, sent when its news count was `news`, found the
    /// next due time `next`. News since then is kept: the tick may have run
    /// before what it told of.
    pub fn ticked(&self, shard: usize, news: u64, next: Option<Instant>) {
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let (when, now_news) = &mut due[shard];
        let found = match next {
            Some(at) => Due::At(at),
            None => Due::Never,
        };
        *when = match (*now_news == news, *when, found) {
            (true, _, found) => found,
            (false, Due::Unknown, _) => Due::Unknown,
            (false, Due::At(a), Due::At(b)) => Due::At(a.min(b)),
            (false, Due::At(a), _) | (false, Due::Never, Due::At(a)) => Due::At(a),
            (false, Due::Never, _) => Due::Never,
        };
    }

    /// Every shard's news may have been missed.
    pub fn forget_all(&self) {
        for (when, news) in self
            .due
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter_mut()
        {
            *when = Due::Unknown;
            *news += 1;
        }
        self.rescan
            .store(ALL_SHARDS, std::sync::atomic::Ordering::Release);
    }

    /// The live processes are now `live`; shards that pass to `me` are
    /// ticked at once (their owner may have died with something due).
    pub fn set_live(&self, me: &str, live: Vec<String>) {
        let mut old = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if *old == live {
            return;
        }
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        for (shard, (when, news)) in due.iter_mut().enumerate() {
            if owner(&live, shard) == Some(me) && owner(&old, shard) != Some(me) {
                *when = Due::Unknown;
                *news += 1;
            }
        }
        *old = live;
    }

    /// The shards this process ticks that are due by `now` (each with its
    /// news count, for [`Sharding::ticked`]), and the time of the earliest
    /// one that is not.
    pub fn to_tick(&self, me: &str, now: Instant) -> (Vec<(usize, u64)>, Option<Instant>) {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ready = Vec::new();
        let mut next: Option<Instant> = None;
        for (shard, &(when, news)) in due.iter().enumerate() {
            // Until the first heartbeat names the live processes, this one
            // ticks every shard.
            if !live.is_empty() && owner(&live, shard) != Some(me) {
                continue;
            }
            match when {
                Due::Unknown => ready.push((shard, news)),
                Due::At(at) if at <= now => ready.push((shard, news)),
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

    /// One pause set (`Some(end)`) or lifted by this process.
    pub fn pause(&self, tube: &Tube, until: Option<Instant>) {
        let mut known = self.pauses.lock().unwrap_or_else(PoisonError::into_inner);
        match until {
            Some(at) => known.insert(tube.clone(), at),
            None => known.remove(tube),
        };
    }

    /// Whether any tube is known to be paused.
    pub fn pausing(&self) -> bool {
        !self
            .pauses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
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

    /// Whether `key` (whose remainder by [`SHARDS`] is its shard) is in
    /// `mask`.
    fn fits_mask(mask: u64, key: u64) -> bool {
        mask >> (key % SHARDS as u64) & 1 == 1
    }

    #[test]
    fn slots_are_those_redis_gives() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), 8363);
    }

    #[test]
    fn every_shard_tag_lies_in_its_own_range() {
        let s = Sharding::new("delayq:", Some(SHARDS), Vec::new());
        for (k, tag) in s.tags[..SHARDS].iter().enumerate() {
            assert_eq!(shard_of_slot(slot(tag.as_bytes())), k, "{tag}");
            assert_eq!(slot(format!("{tag}jobs").as_bytes()), slot(tag.as_bytes()));
        }
        assert_eq!(s.tags[SHARDS], "{delayq:}");
    }

    #[test]
    fn ids_name_their_shard() {
        let s = Sharding::new("delayq:", Some(SHARDS), Vec::new());
        for n in [1, 64, 65, 127, 1 << 40] {
            assert_eq!(s.locate(&JobId::Server(n)), (n % 64) as usize);
        }
        // A client id lives in the shard of the slot Redis gives it.
        let name = JobId::parse(b"foo").unwrap();
        assert_eq!(s.locate(&name), 12182 * SHARDS / SLOTS);
    }

    #[test]
    fn keys_fit_the_shards_of_their_tube() {
        let s = Sharding::new("delayq:", Some(16), vec!["fifo".into()]);
        let orders = Tube::parse(b"orders").unwrap();
        let fitting: Vec<u64> = (0..64).filter(|&k| fits_mask(s.mask(&orders), k)).collect();
        assert_eq!(fitting.len(), 16);
        assert!(fitting.windows(2).all(|w| w[1] - w[0] == 4));
        let fifo = Tube::parse(b"fifo").unwrap();
        assert_eq!(
            (0..640).filter(|&k| fits_mask(s.mask(&fifo), k)).count(),
            10
        );
        let all = Sharding::new("delayq:", Some(SHARDS), Vec::new());
        assert!((0..64).all(|k| fits_mask(all.mask(&orders), k)));
    }

    /// Each shard's primary when the cluster's slots are split into `n`
    /// equal ranges, as `redis-cli --cluster create` splits them.
    fn ranges(prefix: &str, n: usize) -> Vec<String> {
        (0..SHARDS)
            .map(|k| {
                let slot = slot(shard_tag(prefix, k).as_bytes());
                format!("node{}", slot * n / SLOTS)
            })
            .collect()
    }

    /// How many of `mask`'s shards each primary of `primaries` serves.
    fn per_primary(mask: u64, primaries: &[String]) -> HashMap<String, usize> {
        let mut per = HashMap::new();
        for k in (0..SHARDS).filter(|&k| fits_mask(mask, k as u64)) {
            *per.entry(primaries[k].clone()).or_insert(0) += 1;
        }
        per
    }

    #[test]
    fn one_per_primary_gives_a_tube_one_shard_on_each() {
        let s = Sharding::new("delayq:", None, vec!["fifo".into()]);
        let orders = Tube::parse(b"orders").unwrap();
        // Until the slot map is known, every shard.
        assert_eq!(s.mask(&orders), u64::MAX);
        for n in [1, 2, 3, 5, 7] {
            let primaries = ranges("delayq:", n);
            s.set_primaries(&primaries);
            assert_eq!(s.spread_of(&orders), n);
            let per = per_primary(s.mask(&orders), &primaries);
            assert_eq!(per.len(), n, "{n} primaries: {per:?}");
            assert!(per.values().all(|&c| c == 1), "{n} primaries: {per:?}");
            // The tube's home shard is among them.
            let home = shard_of_key(b"orders");
            assert!(fits_mask(s.mask(&orders), home as u64));
        }
        // A tube kept whole stays on its one shard.
        let fifo = Tube::parse(b"fifo").unwrap();
        assert_eq!(s.mask(&fifo), 1 << shard_of_key(b"fifo"));
    }

    #[test]
    fn shards_are_chosen_evenly_over_uneven_primaries() {
        // One primary serves most shards (say, after a reshard).
        let primaries: Vec<String> = (0..SHARDS)
            .map(|k| ["a", "b", "c"][usize::from(k >= 40) + usize::from(k >= 52)].to_string())
            .collect();
        let s = Sharding::new("delayq:", Some(7), Vec::new());
        assert!(s.set_primaries(&primaries));
        assert!(
            !s.set_primaries(&primaries),
            "the same map again changes nothing"
        );
        for tube in ["orders", "refunds", "x"] {
            let mask = s.mask(&Tube::parse(tube.as_bytes()).unwrap());
            assert_eq!(mask.count_ones(), 7);
            let mut counts: Vec<usize> = per_primary(mask, &primaries).into_values().collect();
            counts.sort_unstable();
            assert_eq!(counts, [2, 2, 3], "{tube}");
        }
        // More shards than the smaller primaries serve: the rest from the
        // one with more.
        let s = Sharding::new("delayq:", Some(40), Vec::new());
        s.set_primaries(&primaries);
        let mask = s.mask(&Tube::parse(b"orders").unwrap());
        let per = per_primary(mask, &primaries);
        assert_eq!((per["a"], per["b"], per["c"]), (16, 12, 12));
    }

    #[test]
    fn candidates_are_the_best_heads_and_old_news_is_ignored() {
        let s = Sharding::new("p", Some(SHARDS), Vec::new());
        let (a, b) = (Tube::parse(b"a").unwrap(), Tube::parse(b"b").unwrap());
        s.head(3, 100, &a, Some((5, 30)));
        s.head(7, 100, &b, Some((5, 20)));
        s.head(9, 100, &a, Some((1, 90)));
        let best: Vec<usize> = s
            .candidates(&[a.clone(), b.clone()])
            .iter()
            .map(|c| c.2)
            .collect();
        assert_eq!(best, [9, 7, 3]);
        s.head(9, 200, &a, None);
        // An announcement older than the news that shard 9 is empty.
        s.head(9, 150, &a, Some((1, 90)));
        assert_eq!(s.candidates(std::slice::from_ref(&a)).len(), 1);
        s.pause(
            &b,
            Some(Instant::now() + std::time::Duration::from_secs(60)),
        );
        assert_eq!(s.candidates(&[b]).len(), 0);
    }

    #[test]
    fn a_tubes_shards_are_taken_in_turn() {
        let mask = 1 << 5 | 1 << 27 | 1 << 42;
        assert_eq!(after(mask, 0), 5);
        assert_eq!(after(mask, 5), 27);
        assert_eq!(after(mask, 27), 42);
        assert_eq!(after(mask, 42), 5, "round again");
        assert_eq!(after(mask, 63), 5);
        assert_eq!(after(1 << 63, 63), 63);
        assert_eq!(after(u64::MAX, 63), 0);
        assert_eq!(key_at_or_after(128, 5), 133);
        assert_eq!(key_at_or_after(133, 5), 133);
        assert_eq!(key_at_or_after(134, 5), 197);
        assert_eq!(key_at_or_after(130, 1), 193);
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
