//! Counts of the connections using and watching each tube, on their way to
//! Redis.
//!
//! Every connection that opens counts itself as a user and a watcher of
//! `default`, and every `use`, `watch`, `ignore` and close changes a count.
//! One operation each would make ten thousand connections opening at once
//! twenty thousand operations, queued in front of their first reserves
//! (which then ran out of time). Instead a change joins the operation for
//! its tube and count that is still waiting in the queue, if there is one.
//! Only when none waits does a change queue a new one. Either way the
//! change is in the queue, ahead of whatever the connection sends next, as
//! soon as it is made; and it is answered once the operation carrying it
//! is done, so a `watch` is still answered only once Redis counts it.
//!
//! The process keeps its counts itself, and an operation carries the count
//! (read when its call is written), not the change: a call sent twice, or
//! a change answered as failed and then undone ([`Refs::undo`]), leaves
//! Redis with the count the process has, whether the first call ran or
//! not; and counts Redis lost, or that another process forgot because
//! this one seemed dead, are sent again whole ([`Refs::restore`]).
//!
//! A count also carries a version, taken as its call is written, so that
//! Redis keeps the latest count however the calls arrive. The cluster
//! client sends a call answered `CLUSTERDOWN`, `TRYAGAIN`, `MASTERDOWN` or
//! `LOADING` (a failover, a cluster still forming) again after a random
//! wait, so a call written before another may run after it; carrying a
//! count read earlier, it would put back a count the process no longer has
//! (a connection gone still counted as watching), until that count next
//! changed. The library ignores a count older than the one it has.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};

use super::batch::{Arg, Op, stopped};
use super::decode::parse;
use super::library::Kind;
use crate::error::StoreResult;
use crate::names::Tube;

/// What one queued operation carries.
#[derive(Default)]
pub(super) struct Sum {
    /// The count after the latest change that joined it.
    count: i64,
    /// Its call is written: later changes need an operation of their own.
    sealed: bool,
    waiting: Vec<oneshot::Sender<StoreResult<()>>>,
}

/// A [`Sum`] shared by the queued operation and the changes joining it.
pub(super) type SharedSum = Arc<Mutex<Sum>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Seals `sum` and returns its count and the count's version, as its call
/// is written.
pub(super) fn seal(sum: &Mutex<Sum>) -> (i64, u64) {
    let mut sum = lock(sum);
    sum.sealed = true;
    (sum.count, next_version())
}

/// A version above every one taken before in this process: the wall clock
/// in microseconds, or one more than the last if the clock is behind it.
/// The library keeps a count's version for a while only (`latest_ref` in
/// `prelude.lua`), measured in these microseconds: a call the cluster
/// client sends again comes within the 2 s a call may take.
pub(super) fn next_version() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(last.saturating_add(1));
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// A tube and a count of it (`u` using, `w` watching).
type Key = (Tube, &'static str);

/// The process's counts, and the operations carrying them.
#[derive(Default)]
pub(super) struct Counts {
    /// Every count above zero.
    counts: HashMap<Key, i64>,
    /// The latest operation of each count; sealed ones are replaced by the
    /// next change.
    latest: HashMap<Key, SharedSum>,
    /// An operation failed: Redis may be off by its change until the counts
    /// are sent again whole.
    dirty: bool,
}

/// The counts of a process, shared with the operation that restores them.
pub(super) type SharedCounts = Arc<Mutex<Counts>>;

/// Every count, as `restore_refs` takes them: `FIELD:TUBE COUNT` pairs
/// separated by spaces, read as its call is written.
pub(super) fn encode(counts: &Mutex<Counts>) -> String {
    let counts = lock(counts);
    let mut out = String::new();
    for ((tube, field), count) in &counts.counts {
        let sep = if out.is_empty() { "" } else { " " };
        let _ = write!(out, "{sep}{field}:{tube} {count}");
    }
    out
}

/// Where a process's count changes join their operations.
pub(super) struct Refs {
    counts: SharedCounts,
    /// The control slot's queue of operations.
    queue: mpsc::UnboundedSender<Op>,
    process: String,
}

impl Refs {
    /// Changes for `process`, sent through `queue`.
    pub(super) fn new(queue: mpsc::UnboundedSender<Op>, process: String) -> Refs {
        Refs {
            counts: Arc::default(),
            queue,
            process,
        }
    }

    /// Undoes a change whose command was answered as failed (so its
    /// connection goes on as if it was not made), whether Redis made it or
    /// not. Not waited for: its command has its answer.
    pub(super) fn undo(&self, tube: &Tube, field: &'static str, delta: i64) {
        // Sent again whole at the next heartbeat too, should the undoing
        // operation fail as well.
        lock(&self.counts).dirty = true;
        // Outside a runtime (one that is shutting down drops its tasks) the
        // operation could not be answered, and nothing would send it.
        if tokio::runtime::Handle::try_current().is_ok() {
            let (tx, _) = oneshot::channel();
            let _ = self.join(tube, field, -delta, tx);
        }
    }

    /// Whether an operation failed since the counts were last sent whole
    /// (Redis may then be off by its change: a failed call may or may not
    /// have run); clears the mark.
    pub(super) fn take_dirty(&self) -> bool {
        std::mem::take(&mut lock(&self.counts).dirty)
    }

    /// Sends every count again, for counts Redis no longer has or may have
    /// wrong. Not waited for: it goes in order with the changes, and if it
    /// fails, the counts are marked for the next heartbeat to send again.
    pub(super) fn restore(&self) {
        let (reply, result) = oneshot::channel();
        let op = Op {
            kind: Kind::Moves,
            name: "restore_refs",
            args: vec![
                Arg::Text(self.process.clone()),
                Arg::Counts(self.counts.clone()),
            ],
            reply,
            unheard: false,
        };
        if self.queue.send(op).is_err() {
            return;
        }
        let all = self.counts.clone();
        tokio::spawn(async move {
            if !matches!(result.await, Ok(Ok(_))) {
                lock(&all).dirty = true;
            }
        });
    }

    /// Changes the count `field` of `tube` by `delta`; done once Redis has
    /// the change. The change is queued before the first await.
    pub(super) async fn change(
        &self,
        tube: &Tube,
        field: &'static str,
        delta: i64,
    ) -> StoreResult<()> {
        let (tx, rx) = oneshot::channel();
        self.join(tube, field, delta, tx)?;
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    fn join(
        &self,
        tube: &Tube,
        field: &'static str,
        delta: i64,
        tx: oneshot::Sender<StoreResult<()>>,
    ) -> StoreResult<()> {
        let key = (tube.clone(), field);
        let mut all = lock(&self.counts);
        let count = {
            let c = all.counts.entry(key.clone()).or_default();
            *c = (*c + delta).max(0);
            *c
        };
        if count == 0 {
            all.counts.remove(&key);
        }
        if let Some(sum) = all.latest.get(&key) {
            let mut open = lock(sum);
            if !open.sealed {
                open.count = count;
                open.waiting.push(tx);
                return Ok(());
            }
        }
        let sum = Arc::new(Mutex::new(Sum {
            count,
            sealed: false,
            waiting: vec![tx],
        }));
        let (reply, result) = oneshot::channel();
        let op = Op {
            kind: Kind::Moves,
            name: "tube_ref",
            args: vec![
                Arg::Text(self.process.clone()),
                Arg::Tube(tube.clone()),
                Arg::Static(field),
                Arg::Sum(sum.clone()),
            ],
            reply,
            unheard: false,
        };
        self.queue.send(op).map_err(|_| stopped())?;
        all.latest.insert(key.clone(), sum.clone());
        drop(all);
        // A task of its own answers the changes, not a caller: a command
        // cut off while it waits must not leave the others unanswered.
        let all = self.counts.clone();
        tokio::spawn(async move {
            let result = match result.await {
                Ok(value) => value.and_then(parse::<i64>).map(drop),
                Err(_) => Err(stopped()),
            };
            // Done, the operation leaves the map unless a later one took
            // its place, so the map holds only operations under way.
            {
                let mut all = lock(&all);
                if all.latest.get(&key).is_some_and(|l| Arc::ptr_eq(l, &sum)) {
                    all.latest.remove(&key);
                }
                all.dirty |= result.is_err();
            }
            let waiting = {
                // Sealed even if its call was never written (the sender
                // stopped), so that no change joins it after this.
                let mut sum = lock(&sum);
                sum.sealed = true;
                std::mem::take(&mut sum.waiting)
            };
            for tx in waiting {
                // One whose command has gone needs no answer.
                let _ = tx.send(result.clone());
            }
        });
        Ok(())
    }
}
