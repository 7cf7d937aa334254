//! Batching: operations of many connections share one function call.
//!
//! Operations queue on a channel; a sender task takes whatever queued while
//! the calls before it were out and sends it as one call per kind, so under
//! load many commands share one round trip and one function call, while a
//! lone command waits for nothing. Calls are pipelined on the one
//! multiplexed connection.

use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::{RedisError, Value};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::info;

use super::library::{Kind, Library};
use super::{corrupt, fail};
use crate::error::{StoreError, StoreResult};

/// Most operations one call carries, so that no call holds Redis long.
const MAX_BATCH: usize = 256;
/// Most batches out at once: the next batch gathers while the one before it
/// runs, and is already on the wire when Redis is done with it.
const IN_FLIGHT: usize = 2;

/// An operation waiting for the next call of its kind.
pub(super) struct Op {
    pub kind: Kind,
    pub name: &'static str,
    pub args: Vec<Vec<u8>>,
    pub reply: oneshot::Sender<StoreResult<Value>>,
}

/// Loads `library` into Redis, if it is not there already.
pub(super) async fn load(
    conn: &mut ConnectionManager,
    library: &Library,
) -> Result<(), RedisError> {
    let loaded: Result<String, RedisError> = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&library.source)
        .query_async(conn)
        .await;
    match loaded {
        Ok(_) => Ok(()),
        // Another delayq process of this version loaded it first.
        Err(e) if e.to_string().contains("already exists") => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sends the operations queued on `queue` until every sender is gone.
pub(super) async fn run(
    conn: ConnectionManager,
    tag: String,
    library: Library,
    mut queue: mpsc::UnboundedReceiver<Op>,
) {
    let library = Arc::new(library);
    let tag = Arc::<str>::from(tag);
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut ops = Vec::with_capacity(MAX_BATCH);
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        if queue.recv_many(&mut ops, MAX_BATCH).await == 0 {
            return;
        }
        let mut by_kind: [Vec<Op>; 3] = Default::default();
        for op in ops.drain(..) {
            by_kind[op.kind as usize].push(op);
        }
        let (conn, tag, library) = (conn.clone(), tag.clone(), library.clone());
        tokio::spawn(async move {
            let [puts, moves, reads] = by_kind;
            let done = tokio::join!(
                send(&conn, &tag, &library, Kind::Puts, puts),
                send(&conn, &tag, &library, Kind::Moves, moves),
                send(&conn, &tag, &library, Kind::Reads, reads),
            );
            // The next batch goes out before the connections waiting on this
            // one are woken, so Redis is not left idle while they reply.
            drop(permit);
            for (reply, result) in [done.0, done.1, done.2].into_iter().flatten() {
                let _ = reply.send(result);
            }
        });
    }
}

/// A reply channel and what to send on it.
type Done = Vec<(oneshot::Sender<StoreResult<Value>>, StoreResult<Value>)>;

/// Runs `ops` in one call of the function for `kind`; returns each one's
/// result with its reply channel.
async fn send(
    conn: &ConnectionManager,
    tag: &str,
    library: &Library,
    kind: Kind,
    ops: Vec<Op>,
) -> Done {
    if ops.is_empty() {
        return Vec::new();
    }
    let mut call = redis::cmd("FCALL");
    // One declared key, so a cluster-aware client routes the call to the
    // node of the prefix's hash slot, where every key it touches lives.
    call.arg(library.function(kind))
        .arg(1)
        .arg(format!("{tag}jobs"))
        .arg(tag);
    let mut replies = Vec::with_capacity(ops.len());
    for op in ops {
        call.arg(op.name).arg(op.args.len());
        for arg in op.args {
            call.arg(arg);
        }
        replies.push(op.reply);
    }
    let mut conn = conn.clone();
    let mut result = call.query_async::<Vec<Value>>(&mut conn).await;
    if matches!(&result, Err(e) if e.to_string().contains("Function not found")) {
        // Redis lost the library (a restart without persistence, or a
        // FUNCTION FLUSH); the call did not run, so it is safe to repeat.
        info!("loading delayq's function library into Redis");
        result = match load(&mut conn, library).await {
            Ok(()) => call.query_async(&mut conn).await,
            Err(e) => Err(e),
        };
    }
    match result {
        Ok(results) if results.len() == replies.len() => replies
            .into_iter()
            .zip(results.into_iter().map(outcome))
            .collect(),
        Ok(_) => replies
            .into_iter()
            .map(|reply| (reply, Err(corrupt("a batch's length"))))
            .collect(),
        Err(e) => {
            let e = fail(e);
            replies
                .into_iter()
                .map(|reply| (reply, Err(e.clone())))
                .collect()
        }
    }
}

/// One operation's place in a call's reply: its result, or the error it
/// failed with.
fn outcome(entry: Value) -> StoreResult<Value> {
    match entry {
        Value::ServerError(e) => Err(StoreError::Unavailable(format!(
            "{}: {}",
            e.code(),
            e.details().unwrap_or_default()
        ))),
        other => Ok(other),
    }
}
