//! Connections blocked in `reserve`, queued per tube, first come first served.
//!
//! A waiter is a oneshot sender. It is registered in the queue of every tube it
//! waits on and removed from all of them at once when it is served or gives up,
//! so a queue never holds stale entries and its length is the tube's
//! `current-waiting`.

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

#[derive(Default)]
struct Inner {
    next: WaiterId,
    entries: HashMap<WaiterId, Entry>,
    /// Per tube, the ids waiting on it in arrival order.
    queues: HashMap<Tube, BTreeSet<WaiterId>>,
}

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

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `conn` on `tubes`; the receiver gets the job it is handed.
    pub fn register(
        &self,
        conn: ConnId,
        tubes: Arc<[Tube]>,
    ) -> (WaiterId, oneshot::Receiver<Handout>) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        inner.next += 1;
        let id = inner.next;
        for tube in tubes.iter() {
            inner.queues.entry(tube.clone()).or_default().insert(id);
        }
        inner.entries.insert(id, Entry { conn, tubes, tx });
        (id, rx)
    }

    /// Removes a waiter and returns its sender, if it is still registered.
    pub fn take(&self, id: WaiterId) -> Option<oneshot::Sender<Handout>> {
        let mut inner = self.lock();
        let entry = inner.entries.remove(&id)?;
        for tube in entry.tubes.iter() {
            if let Some(queue) = inner.queues.get_mut(tube) {
                queue.remove(&id);
                if queue.is_empty() {
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

    /// Whether anyone waits on `tube`.
    pub fn any(&self, tube: &Tube) -> bool {
        self.lock().queues.contains_key(tube)
    }

    /// Connections waiting on `tube`.
    pub fn waiting_on(&self, tube: &Tube) -> u64 {
        self.lock().queues.get(tube).map_or(0, |q| q.len() as u64)
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
