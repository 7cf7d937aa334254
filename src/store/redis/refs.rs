//! Counts of the connections using and watching each tube, on their way to
//! Redis.
//!
//! Every connection that opens counts itself as a user and a watcher of
//! `default`, and every `use`, `watch`, `ignore` and close changes a count.
//! One operation each would make ten thousand connections opening at once
//! twenty thousand operations, queued in front of their first reserves
//! (which then ran out of time). Instead the changes gather here while a
//! call carries the ones before them, and go as one operation per tube and
//! count, by the sum of their changes. Each change is answered once the
//! operation carrying it is done, so a `watch` is still answered only once
//! Redis counts it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};

use super::batch::{Arg, Op};
use super::decode::parse;
use super::library::Kind;
use crate::error::{StoreError, StoreResult};
use crate::names::Tube;

/// Changes waiting to be sent, by tube and count (`u` using, `w`
/// watching): their sum, and who waits for them.
type Pending = HashMap<(Tube, &'static str), (i64, Vec<oneshot::Sender<StoreResult<()>>>)>;

#[derive(Default)]
struct Gathered {
    pending: Pending,
    /// A task is sending changes; it sends these after.
    sending: bool,
}

/// Where a process's count changes gather.
pub(super) struct Refs {
    gathered: Arc<Mutex<Gathered>>,
    /// The control slot's queue of operations.
    queue: mpsc::UnboundedSender<Op>,
    process: String,
}

impl Refs {
    /// Changes for `process`, sent through `queue`.
    pub(super) fn new(queue: mpsc::UnboundedSender<Op>, process: String) -> Refs {
        Refs {
            gathered: Arc::default(),
            queue,
            process,
        }
    }

    /// Changes the count `field` of `tube` by `delta`; done once Redis has
    /// the change.
    pub(super) async fn change(
        &self,
        tube: &Tube,
        field: &'static str,
        delta: i64,
    ) -> StoreResult<()> {
        let (tx, rx) = oneshot::channel();
        {
            let mut gathered = lock(&self.gathered);
            let entry = gathered.pending.entry((tube.clone(), field)).or_default();
            entry.0 += delta;
            entry.1.push(tx);
            if !gathered.sending {
                gathered.sending = true;
                // A task of its own, not the caller: a command cut off
                // while it waits must not strand the changes of others.
                tokio::spawn(send(
                    self.gathered.clone(),
                    self.queue.clone(),
                    self.process.clone(),
                ));
            }
        }
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn lock(gathered: &Mutex<Gathered>) -> std::sync::MutexGuard<'_, Gathered> {
    gathered.lock().unwrap_or_else(PoisonError::into_inner)
}

fn stopped() -> StoreError {
    StoreError::Unavailable("the batch sender has stopped".into())
}

/// Sends what has gathered, one operation per tube and count, until
/// nothing more has.
async fn send(gathered: Arc<Mutex<Gathered>>, queue: mpsc::UnboundedSender<Op>, process: String) {
    loop {
        let pending = {
            let mut gathered = lock(&gathered);
            if gathered.pending.is_empty() {
                gathered.sending = false;
                return;
            }
            std::mem::take(&mut gathered.pending)
        };
        join_all(
            pending
                .into_iter()
                .map(|((tube, field), (delta, waiting))| {
                    let (queue, process) = (&queue, &process);
                    async move {
                        // Changes that cancel out (one connection's `watch`, another's
                        // `ignore`) leave the count as it is.
                        let result = if delta == 0 {
                            Ok(())
                        } else {
                            one(queue, process, tube, field, delta).await
                        };
                        for tx in waiting {
                            // One whose command has gone needs no answer.
                            let _ = tx.send(result.clone());
                        }
                    }
                }),
        )
        .await;
    }
}

/// One `tube_ref` operation.
async fn one(
    queue: &mpsc::UnboundedSender<Op>,
    process: &str,
    tube: Tube,
    field: &'static str,
    delta: i64,
) -> StoreResult<()> {
    let (reply, result) = oneshot::channel();
    let op = Op {
        kind: Kind::Moves,
        name: "tube_ref",
        args: vec![
            Arg::Text(process.to_string()),
            Arg::Tube(tube),
            Arg::Static(field),
            Arg::Text(delta.to_string()),
        ],
        reply,
    };
    queue.send(op).map_err(|_| stopped())?;
    let value = result.await.map_err(|_| stopped())??;
    parse::<i64>(value).map(drop)
}
