//! Counts of the connections using and watching each tube, on their way to
//! Redis.
//!
//! Every connection that opens counts itself as a user and a watcher of
//! `default`, and every `use`, `watch`, `ignore` and close changes a count.
//! One operation each would make ten thousand connections opening at once
//! twenty thousand operations, queued in front of their first reserves
//! (which then ran out of time). Instead a change joins the operation for
//! its tube and count that is still waiting in the queue, if there is one:
//! the operation carries the sum, read when its call is written (and from
//! then on it takes no more). Only when none waits does a change queue a new
//! one. Either way the change is in the queue, ahead of whatever the
//! connection sends next, as soon as it is made; and it is answered once
//! the operation carrying it is done, so a `watch` is still answered only
//! once Redis counts it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{mpsc, oneshot};

use super::batch::{Arg, Op, stopped};
use super::decode::parse;
use super::library::Kind;
use crate::error::StoreResult;
use crate::names::Tube;

/// The changes one queued operation carries.
#[derive(Default)]
pub(super) struct Sum {
    delta: i64,
    /// Its call is written: later changes need an operation of their own.
    sealed: bool,
    waiting: Vec<oneshot::Sender<StoreResult<()>>>,
}

/// A [`Sum`] shared by the queued operation and the changes joining it.
pub(super) type SharedSum = Arc<Mutex<Sum>>;

fn lock(sum: &Mutex<Sum>) -> MutexGuard<'_, Sum> {
    sum.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Seals `sum` and returns its change, as its call is written.
pub(super) fn seal(sum: &Mutex<Sum>) -> i64 {
    let mut sum = lock(sum);
    sum.sealed = true;
    sum.delta
}

type Latest = HashMap<(Tube, &'static str), SharedSum>;

/// Where a process's count changes join their operations.
pub(super) struct Refs {
    /// The latest operation of each tube and count (`u` using, `w`
    /// watching); sealed ones are replaced by the next change.
    latest: Arc<Mutex<Latest>>,
    /// The control slot's queue of operations.
    queue: mpsc::UnboundedSender<Op>,
    process: String,
}

impl Refs {
    /// Changes for `process`, sent through `queue`.
    pub(super) fn new(queue: mpsc::UnboundedSender<Op>, process: String) -> Refs {
        Refs {
            latest: Arc::default(),
            queue,
            process,
        }
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
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sum) = latest.get(&key) {
            let mut open = lock(sum);
            if !open.sealed {
                open.delta += delta;
                open.waiting.push(tx);
                return Ok(());
            }
        }
        let sum = Arc::new(Mutex::new(Sum {
            delta,
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
        };
        self.queue.send(op).map_err(|_| stopped())?;
        latest.insert(key.clone(), sum.clone());
        drop(latest);
        // A task of its own answers the changes, not a caller: a command
        // cut off while it waits must not leave the others unanswered.
        let all = self.latest.clone();
        tokio::spawn(async move {
            let result = match result.await {
                Ok(value) => value.and_then(parse::<i64>).map(drop),
                Err(_) => Err(stopped()),
            };
            // Done, the operation leaves the map unless a later one took
            // its place, so the map holds only operations under way.
            {
                let mut latest = all.lock().unwrap_or_else(PoisonError::into_inner);
                if latest.get(&key).is_some_and(|l| Arc::ptr_eq(l, &sum)) {
                    latest.remove(&key);
                }
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
