//! Connections blocked in `reserve`, queued per tube, first come first served.
//!
//! A waiter is a oneshot sender. It is registered in the queue of every tube it
//! waits on and removed from all of them at once when it is served or gives up,
//! so a queue never holds stale entries and its length is the tube's
//! `current-waiting`.
//!
//! A tube's queue also remembers whether the tube is known to have nothing
//! to reserve: a look at the store that found nothing, with no hand-out
//! served since it began. Every change that makes a job ready is followed by
//! a hand-out ([`Waiters::served`]), so until one comes, another look would
//! find nothing too, and a reserve can queue without asking the store; when
//! it comes, it finds the reserve queued. On Redis that spares a round trip
//! for each worker that comes back for more while its tube is empty, and
//! the hand-out that would otherwise follow its queueing.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::job::Reserved;
use crate::names::Tube;
use crate::store::ConnId;

/// Identifies one registration; later registrations have larger ids.
pub type WaiterId = u64;

/// A job reserved for a waiter.
#[derive(Debug, PartialEq)]
pub struct Handout {
    /// The job.
    pub got: Reserved,
    /// When the store was asked to reserve it. The store counts the job's
    /// time to run from a moment after this, so a deadline counted from
    /// here has never passed while the job is still reserved; counted from
    /// when the waiter got it, it could pass later, and the waiter would
    /// take a job that its TTR had already taken back for one it holds
    /// (`DEADLINE_SOON`).
    pub asked: Instant,
}

struct Entry {
    conn: ConnId,
    tubes: Arc<[Tube]>,
    tx: oneshot::Sender<Handout>,
}

/// The waiters of one tube, and what is known of its ready jobs.
struct Queue {
    /// The ids waiting on it, in arrival order.
    ids: BTreeSet<WaiterId>,
    /// When something last may have made jobs of it ready (a [`Look`]
    /// number; see [`Waiters::served`]), or when the queue began, if later:
    /// what came before is not known.
    served: u64,
    /// The tube had nothing to reserve at a look begun then, and no
    /// hand-out of it came since.
    empty_since: Option<u64>,
}

#[derive(Default)]
struct Inner {
    next: WaiterId,
    entries: HashMap<WaiterId, Entry>,
    /// Per tube with anyone waiting.
    queues: HashMap<Tube, Queue>,
    /// Counts the hand-outs of what may have made jobs ready, so that a
    /// look can tell whether one came after it began.
    seq: u64,
}

/// When a look at the store began, among the hand-outs of what may have
/// made jobs ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Look(u64);

/// The registry of waiting connections.
#[derive(Default)]
pub struct Waiters {
    inner: Mutex<Inner>,
}

/// The waiter at the head of a tube's queue.
pub struct Head {
    /// Its registration.
    pub id: WaiterId,
    /// The connection waiting.
    pub conn: ConnId,
    /// Every tube it waits on.
    pub tubes: Arc<[Tube]>,
}

impl Queue {
    fn found_empty(&mut self, look: Look) {
        if self.served <= look.0 && self.empty_since.is_none() {
            self.empty_since = Some(look.0);
        }
    }
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Before a look at the store for a job of `tubes`: when it begins, and
    /// whether every one of them is known to have nothing to reserve, so
    /// that the look would find nothing and can be spared.
    pub fn look(&self, tubes: &[Tube]) -> (Look, bool) {
        let inner = self.lock();
        let known = !tubes.is_empty()
            && tubes.iter().all(|tube| {
                (inner.queues.get(tube)).is_some_and(|queue| queue.empty_since.is_some())
            });
        (Look(inner.seq), known)
    }

    /// A look begun at `look` found nothing to reserve in any of `tubes`:
    /// those no hand-out came to since are known to have nothing.
    pub fn found_empty(&self, tubes: &[Tube], look: Look) {
        let mut inner = self.lock();
        for tube in tubes {
            if let Some(queue) = inner.queues.get_mut(tube) {
                queue.found_empty(look);
            }
        }
    }

    /// A hand-out of `tubes` begins: something may have made jobs of them
    /// ready. Returns those anyone waits on.
    pub fn served(&self, tubes: &[Tube]) -> Vec<Tube> {
        if tubes.is_empty() {
            // A timer tick that made nothing ready.
            return Vec::new();
        }
        let mut inner = self.lock();
        inner.seq += 1;
        let seq = inner.seq;
        let mut waited = Vec::new();
        for tube in tubes {
            if let Some(queue) = inner.queues.get_mut(tube) {
                queue.served = seq;
                queue.empty_since = None;
                waited.push(tube.clone());
            }
        }
        waited
    }

    /// Those of `tubes` anyone waits on.
    pub fn waited(&self, tubes: &[Tube]) -> Vec<Tube> {
        let inner = self.lock();
        (tubes.iter())
            .filter(|tube| inner.queues.contains_key(*tube))
            .cloned()
            .collect()
    }

    /// Queues `conn` on `tubes`; the receiver gets the job it is handed.
    /// `looked`: when the look that found nothing in any of them began.
    /// Also returns whether the tubes must be served now: unless no
    /// hand-out of any came since that look, a job made ready meanwhile may
    /// have found nobody waiting.
    pub fn register(
        &self,
        conn: ConnId,
        tubes: Arc<[Tube]>,
        looked: Option<Look>,
    ) -> (WaiterId, oneshot::Receiver<Handout>, bool) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        inner.next += 1;
        let (id, seq) = (inner.next, inner.seq);
        let mut serve = looked.is_none();
        for tube in tubes.iter() {
            let queue = inner.queues.entry(tube.clone()).or_insert_with(|| Queue {
                ids: BTreeSet::new(),
                served: seq,
                empty_since: None,
            });
            queue.ids.insert(id);
            match looked {
                Some(look) if queue.served <= look.0 => queue.found_empty(look),
                _ => serve = true,
            }
        }
        inner.entries.insert(id, Entry { conn, tubes, tx });
        (id, rx, serve)
    }

    /// Removes a waiter and returns its sender, if it is still registered.
    pub fn take(&self, id: WaiterId) -> Option<oneshot::Sender<Handout>> {
        let mut inner = self.lock();
        let entry = inner.entries.remove(&id)?;
        for tube in entry.tubes.iter() {
            if let Some(queue) = inner.queues.get_mut(tube) {
                queue.ids.remove(&id);
                if queue.ids.is_empty() {
                    inner.queues.remove(tube);
                }
            }
        }
        Some(entry.tx)
    }

    /// The `n` longest-waiting connections on `tube`, longest first.
    pub fn heads(&self, tube: &Tube, n: usize) -> Vec<Head> {
        let inner = self.lock();
        let Some(queue) = inner.queues.get(tube) else {
            return Vec::new();
        };
        queue
            .ids
            .iter()
            .take(n)
            .map(|&id| {
                let entry = &inner.entries[&id];
                Head {
                    id,
                    conn: entry.conn,
                    tubes: entry.tubes.clone(),
                }
            })
            .collect()
    }

    /// Connections waiting on `tube`.
    pub fn waiting_on(&self, tube: &Tube) -> u64 {
        self.lock()
            .queues
            .get(tube)
            .map_or(0, |q| q.ids.len() as u64)
    }

    /// Every tube someone waits on.
    pub fn tubes(&self) -> Vec<Tube> {
        self.lock().queues.keys().cloned().collect()
    }

    /// Connections waiting on any tube.
    pub fn total(&self) -> u64 {
        self.lock().entries.len() as u64
    }
}
