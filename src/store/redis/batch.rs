//! Batching: operations of many connections share one function call.
//!
//! Operations queue on a channel; a sender task takes whatever queued while
//! the calls before it were out and sends it as one call per kind, so under
//! load many commands share one round trip and one function call, while a
//! lone command waits for nothing. Calls are pipelined on the one
//! multiplexed connection.

use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::aio::ConnectionManager;
use redis::{RedisError, Value};
use tokio::sync::{mpsc, oneshot};
use tracing::info;

use super::library::{Function, Kind, Library};
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
///
/// Calls in flight are polled here rather than in tasks of their own, so a
/// reply reaches the connections waiting on it without another hop through
/// the scheduler.
pub(super) async fn run(
    conn: ConnectionManager,
    tag: String,
    library: Library,
    mut queue: mpsc::UnboundedReceiver<Op>,
) {
    let library = Arc::new(library);
    let tag = Arc::<str>::from(tag);
    let mut flying = FuturesUnordered::new();
    let mut ops = Vec::with_capacity(MAX_BATCH);
    let mut open = true;
    while open || !flying.is_empty() {
        tokio::select! {
            Some(done) = flying.next(), if !flying.is_empty() => {
                let done: Done = done;
                for (reply, result) in done {
                    let _ = reply.send(result);
                }
            }
            n = queue.recv_many(&mut ops, MAX_BATCH), if open && flying.len() < IN_FLIGHT => {
                if n == 0 {
                    open = false;
                    continue;
                }
                let batch: Vec<Op> = ops.drain(..).collect();
                let (conn, tag, library) = (conn.clone(), tag.clone(), library.clone());
                flying.push(async move { send(conn, &tag, &library, batch).await });
            }
        }
    }
}

/// A reply channel and what to send on it.
type Done = Vec<(oneshot::Sender<StoreResult<Value>>, StoreResult<Value>)>;

/// Runs `ops` in one function call; returns each one's result with its
/// reply channel.
async fn send(mut conn: ConnectionManager, tag: &str, library: &Library, ops: Vec<Op>) -> Done {
    match call(&mut conn, tag, library, Function::Any, &ops).await {
        // Redis is over maxmemory and refused the call before it ran: the
        // puts are refused, the rest go again in the function that may run.
        Err(e) if e.code() == Some("OOM") => {
            let (puts, rest): (Vec<Op>, Vec<Op>) =
                ops.into_iter().partition(|op| op.kind == Kind::Puts);
            let mut done: Done = puts
                .into_iter()
                .map(|op| (op.reply, Err(StoreError::OutOfMemory)))
                .collect();
            if !rest.is_empty() {
                let result = call(&mut conn, tag, library, Function::Drain, &rest).await;
                done.extend(answers(rest, result));
            }
            done
        }
        result => answers(ops, result),
    }
}

/// One call of `function` running `ops`, in order.
async fn call(
    conn: &mut ConnectionManager,
    tag: &str,
    library: &Library,
    function: Function,
    ops: &[Op],
) -> Result<Vec<Value>, RedisError> {
    let mut cmd = redis::cmd("FCALL");
    // One declared key, so a cluster-aware client routes the call to the
    // node of the prefix's hash slot, where every key it touches lives.
    cmd.arg(library.function(function))
        .arg(1)
        .arg(format!("{tag}jobs"))
        .arg(tag);
    for op in ops {
        cmd.arg(op.name).arg(op.args.len());
        for arg in &op.args {
            cmd.arg(arg.as_slice());
        }
    }
    let result = cmd.query_async(conn).await;
    if matches!(&result, Err(e) if e.to_string().contains("Function not found")) {
        // Redis lost the library (a restart without persistence, or a
        // FUNCTION FLUSH); the call did not run, so it is safe to repeat.
        info!("loading delayq's function library into Redis");
        load(conn, library).await?;
        return cmd.query_async(conn).await;
    }
    result
}

/// Each operation's reply channel with its part of a call's result.
fn answers(ops: Vec<Op>, result: Result<Vec<Value>, RedisError>) -> Done {
    let replies = ops.into_iter().map(|op| op.reply);
    match result {
        Ok(results) if results.len() == replies.len() => {
            replies.zip(results.into_iter().map(outcome)).collect()
        }
        Ok(_) => replies
            .map(|reply| (reply, Err(corrupt("a batch's length"))))
            .collect(),
        Err(e) => {
            let e = fail(e);
            replies.map(|reply| (reply, Err(e.clone()))).collect()
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
