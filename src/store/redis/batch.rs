//! Batching: operations of many connections share one function call.
//!
//! Operations queue on a channel; a sender task takes whatever queued while
//! the calls before it were out and sends it as one call, so under load many
//! commands share one round trip and one function call, while a lone command
//! waits for nothing. Calls are pipelined on the one multiplexed connection.
//!
//! A call is `FCALL <function> 1 <P>jobs <P> <puts> <mode> <op> <args>...`:
//! the number of puts it holds, the mode (empty on one Redis; on a cluster
//! `s:` and a token no other call has, so that a call the cluster client
//! sends twice runs once), then each operation's name and its arguments
//! (each operation has a fixed number; see `lua/batch.lua`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::{RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};
use tracing::info;

use super::conn::Conn;
use super::decode::{corrupt, fail};
use super::library::{Function, Kind, Library};
use super::refs::{SharedCounts, SharedSum, encode, next_version, seal};
use super::shards::{SHARDS, Sharding};
use crate::error::{StoreError, StoreResult};
use crate::names::{JobId, Tube};
use crate::store::ConnId;

/// Most operations one call carries, so that no call holds Redis long.
const MAX_BATCH: usize = 256;
/// Most batches out at once: the next batches gather while the ones before
/// run, and are already on the wire when Redis is done with them. Measured
/// on the cycle benchmark against one Redis (2026-11-27, alternated runs of
/// 8 s, the same binary): 15,861 cycles/s on average over five runs with 2,
/// 17,033 with 4 (and 35.9 µs of delayq's CPU a cycle against 38.5), 16,742
/// over three with 8, 14,150 over two with 1.
const IN_FLIGHT: usize = 4;

/// An operation waiting for the next call.
pub(super) struct Op {
    pub kind: Kind,
    pub name: &'static str,
    pub args: Vec<Arg>,
    pub reply: oneshot::Sender<StoreResult<Value>>,
    /// Sent even though nobody waits for its reply (a give-back). Any other
    /// operation whose reply nobody waits for any more is dropped unsent:
    /// its command ran out of time and was answered as failed, and while
    /// Redis hangs such operations would pile up here without bound.
    pub unheard: bool,
}

impl Op {
    /// Whether it is not to be sent: its command has its answer already.
    fn abandoned(&self) -> bool {
        !self.unheard && self.reply.is_closed()
    }
}

/// One argument of an operation. Arguments are turned into bytes only when
/// the call is written, straight into it, so an operation costs one
/// allocation to build however many arguments it has.
pub(super) enum Arg {
    /// Fixed text.
    Static(&'static str),
    /// A tube's name.
    Tube(Tube),
    /// Any other text.
    Text(String),
    /// A number.
    Int(u64),
    /// The connection that holds (or is to hold) a job: its process and
    /// number, `PROCESS:CONN`.
    Owner(ConnId),
    /// A job id as the scripts take it: `#` and the job's key (its number
    /// as 12 hex digits) for a server id, the text of a client-chosen one.
    Id(JobId),
    /// A job body.
    Body(Bytes),
    /// The summed change of use or watch counts that an operation carries,
    /// which changes join until the call is written; written as two
    /// arguments, the count and its version.
    Sum(SharedSum),
    /// Every use and watch count of the process, read when the call is
    /// written (in order with the changes' operations); written as two
    /// arguments, the counts and their version.
    Counts(SharedCounts),
}

impl Arg {
    fn write(&self, cmd: &mut redis::Cmd, process: &str, scratch: &mut String) {
        match self {
            Arg::Static(s) => cmd.arg(*s),
            Arg::Tube(t) => cmd.arg(t.as_str()),
            Arg::Text(s) => cmd.arg(s.as_str()),
            Arg::Int(n) => cmd.arg(*n),
            // Written without `std::fmt`: through it, these two cost about
            // 1,400 instructions a cycle on the cycle benchmark (callgrind).
            Arg::Owner(conn) => {
                scratch.clear();
                scratch.push_str(process);
                scratch.push(':');
                scratch.push_str(itoa::Buffer::new().format(*conn));
                cmd.arg(scratch.as_str())
            }
            Arg::Id(JobId::Server(n)) => {
                scratch.clear();
                server_id_key(scratch, *n);
                cmd.arg(scratch.as_str())
            }
            Arg::Id(JobId::Client(name)) => cmd.arg(&**name),
            Arg::Body(b) => cmd.arg(b.as_ref()),
            Arg::Sum(sum) => {
                let (count, version) = seal(sum);
                cmd.arg(count).arg(version)
            }
            Arg::Counts(counts) => cmd.arg(encode(counts)).arg(next_version()),
        };
    }
}

/// What an operation gets when the task that sends the calls has stopped
/// (the store is being dropped).
pub(super) fn stopped() -> StoreError {
    StoreError::Unavailable("the batch sender has stopped".into())
}

/// Appends a server id as its key names it: `#` and the id in lowercase
/// hex, at least 12 digits (what `format!("#{n:012x}")` writes).
pub(super) fn server_id_key(out: &mut String, n: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let len = (16 - n.leading_zeros() as usize / 4).max(12);
    out.push('#');
    for i in (0..len).rev() {
        out.push(char::from(DIGITS[(n >> (4 * i)) as usize & 0xf]));
    }
}

/// Sends the operations queued on `queue` until every sender is gone.
///
/// Calls in flight are polled here rather than in tasks of their own, so a
/// reply reaches the connections waiting on it without another hop through
/// the scheduler.
///
/// With `--redis-wait`, calls holding puts go on `waiting`, a connection of
/// their own (the `WAIT` after them holds their connection up in Redis).
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    conn: Conn,
    waiting: Option<Conn>,
    tag: String,
    process: String,
    library: Arc<Library>,
    shard: Option<(Arc<Sharding>, usize)>,
    wait: Option<(u32, u64)>,
    mut queue: mpsc::UnboundedReceiver<Op>,
) {
    let call = Call {
        wait,
        shard,
        tag: Arc::from(tag),
        process: Arc::from(process),
        library,
    };
    let conn_for = |ops: &[Op]| match &waiting {
        Some(w) if call.wait.is_some() && ops.iter().any(|op| op.kind == Kind::Puts) => w.clone(),
        _ => conn.clone(),
    };
    let mut flying = FuturesUnordered::new();
    let mut ops = Vec::with_capacity(MAX_BATCH);
    let mut open = true;
    while open || !flying.is_empty() {
        tokio::select! {
            Some(done) = flying.next(), if !flying.is_empty() => {
                // The next batch goes out before the connections waiting
                // on this one are woken, so Redis is not left idle while
                // they reply.
                if open {
                    open = take_queued(&mut queue, &mut ops);
                }
                if !ops.is_empty() {
                    flying.push(send(conn_for(&ops), call.clone(), std::mem::take(&mut ops)));
                }
                let done: Done = done;
                let mut orphans = Vec::new();
                for (reply, result, owner) in done {
                    if let (Err(Ok(got)), Some(who)) = (reply.send(result), owner) {
                        orphans.extend(give_back_all(who, got));
                    }
                }
                if !orphans.is_empty() {
                    flying.push(send(conn_for(&orphans), call.clone(), orphans));
                }
            }
            n = queue.recv_many(&mut ops, MAX_BATCH), if open && flying.len() < IN_FLIGHT => {
                if n == 0 {
                    open = false;
                    continue;
                }
                ops.retain(|op| !op.abandoned());
                open = take_queued(&mut queue, &mut ops);
                if !ops.is_empty() {
                    flying.push(send(conn_for(&ops), call.clone(), std::mem::take(&mut ops)));
                }
            }
        }
    }
}

/// Moves what is queued into `ops`, up to [`MAX_BATCH`], dropping the
/// abandoned operations without counting them: while Redis hangs they come
/// faster than the calls that time out take them, and counted, they would
/// pile up in the queue. Returns whether the queue is still open.
fn take_queued(queue: &mut mpsc::UnboundedReceiver<Op>, ops: &mut Vec<Op>) -> bool {
    while ops.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(op) if op.abandoned() => {}
            Ok(op) => ops.push(op),
            Err(mpsc::error::TryRecvError::Empty) => return true,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
    true
}

/// A reply channel, what to send on it, and, for an operation that
/// reserves, who it reserved for.
type Done = Vec<(
    oneshot::Sender<StoreResult<Value>>,
    StoreResult<Value>,
    Option<Reserver>,
)>;

/// An operation that reserves: the connection it reserves for, and whether
/// its reply is a list of jobs (`reserve_many`) rather than one job or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reserver {
    conn: ConnId,
    many: bool,
}

/// Who an operation reserves jobs for, if it reserves any.
fn reserver(op: &Op) -> Option<Reserver> {
    let many = match op.name {
        "reserve" | "reserve_job" => false,
        "reserve_many" => true,
        _ => return None,
    };
    match op.args.first() {
        Some(Arg::Owner(conn)) => Some(Reserver { conn: *conn, many }),
        _ => None,
    }
}

/// The operations that give back what a reserve nobody waits for any more
/// took (see [`give_back`]).
fn give_back_all(who: Reserver, got: Value) -> Vec<Op> {
    match (who.many, got) {
        (false, got) => give_back(who.conn, got).into_iter().collect(),
        (true, Value::Array(jobs)) => jobs
            .into_iter()
            .filter_map(|job| give_back(who.conn, job))
            .collect(),
        (true, _) => Vec::new(),
    }
}

/// The operation that undoes a reservation nobody is waiting for any more:
/// the command that asked for it ran out of time (Redis answered late) and
/// its client was told so, so the job must not stay reserved by a
/// connection that never heard of it until its TTR runs out. `got` is the
/// reserve's reply, `{id, tube, body, ttr}` (or `false`: nothing taken).
fn give_back(conn: ConnId, got: Value) -> Option<Op> {
    let Value::Array(fields) = got else {
        return None;
    };
    // A server id comes back as its number, a client-chosen one as its text.
    let id = match fields.into_iter().next()? {
        Value::Int(n) => JobId::Server(u64::try_from(n).ok()?),
        other => JobId::Client(redis::from_redis_value::<String>(other).ok()?.into()),
    };
    info!(%id, conn, "giving back a job reserved after its command ran out of time");
    // Nobody waits for this reply; a failure leaves the job to its TTR.
    let (reply, _) = oneshot::channel();
    Some(Op {
        kind: Kind::Moves,
        name: "give_back",
        args: vec![Arg::Owner(conn), Arg::Id(id)],
        reply,
        unheard: true,
    })
}

/// What every call needs to know besides its operations.
#[derive(Clone)]
struct Call {
    /// On a cluster, the shards (the calls carry tokens, and their replies
    /// news of the shard) and which this one is.
    shard: Option<(Arc<Sharding>, usize)>,
    tag: Arc<str>,
    process: Arc<str>,
    library: Arc<Library>,
    /// `--redis-wait`: replicas that must have a call's puts before they
    /// are answered, and how long to wait for them (ms).
    wait: Option<(u32, u64)>,
}

/// Runs `ops` in one function call; returns each one's result with its
/// reply channel.
async fn send(mut conn: Conn, call: Call, ops: Vec<Op>) -> Done {
    match call.run(&mut conn, Function::Any, &ops).await {
        // Redis is over maxmemory and refused the call before it ran: the
        // puts are refused, the rest go again in the function that may run.
        Err(e) if e.code() == Some("OOM") => {
            let (puts, rest): (Vec<Op>, Vec<Op>) =
                ops.into_iter().partition(|op| op.kind == Kind::Puts);
            let mut done: Done = puts
                .into_iter()
                .map(|op| (op.reply, Err(StoreError::OutOfMemory), None))
                .collect();
            if !rest.is_empty() {
                let result = call.run(&mut conn, Function::Drain, &rest).await;
                done.extend(answers(rest, result.map(|(results, _)| results)));
            }
            done
        }
        Ok((results, Some(acked))) => {
            // The call's puts are acknowledged only once enough replicas
            // have them: a put the promoted replica lacks is lost in a
            // failover, so it is not acknowledged (the job may be there).
            let replicas = call.wait.unwrap_or_default().0;
            let short = match acked {
                Ok(n) if n >= i64::from(replicas) => None,
                Ok(n) => Some(format!("only {n} of {replicas} replicas have the job")),
                Err(e) => Some(format!("WAIT failed: {e}")),
            };
            let puts: Vec<bool> = ops.iter().map(|op| op.kind == Kind::Puts).collect();
            let mut done = answers(ops, Ok(results));
            if let Some(why) = short {
                for ((_, result, _), put) in done.iter_mut().zip(puts) {
                    if put && result.is_ok() {
                        *result = Err(StoreError::Unavailable(why.clone()));
                    }
                }
            }
            done
        }
        result => answers(ops, result.map(|(results, _)| results)),
    }
}

impl Call {
    /// One call of `function` running `ops`, in order; with
    /// `--redis-wait` and puts among them, also what `WAIT` answered.
    async fn run(
        &self,
        conn: &mut Conn,
        function: Function,
        ops: &[Op],
    ) -> Result<(Vec<Value>, Option<RedisResult<i64>>), RedisError> {
        let puts = ops.iter().filter(|op| op.kind == Kind::Puts).count();
        let mut cmd = redis::cmd("FCALL");
        // One declared key, so a cluster-aware client routes the call to
        // the node of the prefix's hash slot, where every key it touches
        // lives.
        cmd.arg(self.library.function(function))
            .arg(1)
            .arg(format!("{}jobs", self.tag))
            .arg(&*self.tag)
            .arg(puts);
        if let Some((_, shard)) = &self.shard {
            static CALLS: AtomicU64 = AtomicU64::new(0);
            let n = CALLS.fetch_add(1, Ordering::Relaxed);
            let kind = if *shard == SHARDS { 'c' } else { 's' };
            cmd.arg(format!("{kind}:{}.{n:x}", self.process));
        } else {
            cmd.arg("");
        }
        let mut scratch = String::new();
        for op in ops {
            cmd.arg(op.name);
            for arg in &op.args {
                arg.write(&mut cmd, &self.process, &mut scratch);
            }
        }
        let waits = self.wait.filter(|_| puts > 0);
        let mut result = query(conn, &cmd, waits).await;
        if matches!(&result, Err(e) if e.to_string().contains("Function not found")) {
            // Redis lost the library (a restart without persistence, or a
            // FUNCTION FLUSH), or this is a primary that never had it (one
            // added to a cluster, or a replica promoted before the library
            // reached it); the call did not run, so it is safe to repeat.
            info!("loading delayq's function library into Redis");
            conn.load(&self.library.source).await?;
            result = query(conn, &cmd, waits).await;
        }
        // A shard's reply ends with the first ready jobs of the tubes the
        // call changed: learnt here, before anyone waiting on the call
        // hears of it, so the next reserve already knows.
        if let (Ok((results, _)), Some((sharding, shard))) = (&mut result, &self.shard)
            && results.len() > ops.len()
            && let Some(Value::Array(heads)) = results.pop()
        {
            sharding.heads(*shard, heads);
        }
        result
    }
}

/// Sends `cmd`; with `waits` (replicas, timeout in ms), `WAIT` follows it
/// in one pipeline. `WAIT` counts replicas for its own connection's
/// writes: sent on its own, a reconnection (the crate's, or the cluster
/// watchdog's swap) between the two would leave it on a connection with no
/// writes, answered at once, and the puts acknowledged unconfirmed. A
/// pipeline goes out whole on one connection (on a cluster, to the node of
/// the call's key: `WAIT` names no key), or fails whole. A call the
/// cluster client sends again finds its first reply kept under its token,
/// and touches that key, a write, so the `WAIT` after it still counts up
/// to the first run's writes (`lua/batch.lua`).
async fn query(
    conn: &mut Conn,
    cmd: &redis::Cmd,
    waits: Option<(u32, u64)>,
) -> Result<(Vec<Value>, Option<RedisResult<i64>>), RedisError> {
    let Some((replicas, ms)) = waits else {
        return Ok((cmd.query_async(conn).await?, None));
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors()
        .add_command(cmd.clone())
        .cmd("WAIT")
        .arg(replicas)
        .arg(ms);
    let replies: Vec<Value> = pipe.query_async(conn).await?;
    let [called, waited]: [Value; 2] = replies.try_into().map_err(|_| {
        RedisError::from(std::io::Error::other(
            "a call and its WAIT did not get two replies",
        ))
    })?;
    let results = redis::from_redis_value(called.extract_error()?)?;
    let acked = waited
        .extract_error()
        .and_then(|v| redis::from_redis_value(v).map_err(RedisError::from));
    Ok((results, Some(acked)))
}

/// Each operation's reply channel with its part of a call's result.
fn answers(ops: Vec<Op>, result: Result<Vec<Value>, RedisError>) -> Done {
    let replies = ops.into_iter().map(|op| {
        let owner = reserver(&op);
        (op.reply, owner)
    });
    match result {
        Ok(results) if results.len() == replies.len() => replies
            .zip(results.into_iter().map(outcome))
            .map(|((reply, owner), result)| (reply, result, owner))
            .collect(),
        Ok(_) => replies
            .map(|(reply, _)| (reply, Err(corrupt("a batch's length")), None))
            .collect(),
        Err(e) => {
            let e = fail(e);
            replies
                .map(|(reply, _)| (reply, Err(e.clone()), None))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_ids_key_is_what_the_padded_hex_format_writes() {
        let mut ids = vec![0, 1, 0xf, 0x10, 4711, (1 << 48) - 1, 1 << 48, u64::MAX];
        ids.extend((0..64).map(|bit| 1u64 << bit));
        ids.extend((1..64).map(|bit| (1u64 << bit) - 1));
        for n in ids {
            let mut key = String::from("s:");
            server_id_key(&mut key, n);
            assert_eq!(key, format!("s:#{n:012x}"));
        }
    }

    fn reply(id: Value) -> Value {
        Value::Array(vec![
            id,
            Value::BulkString(b"default".to_vec()),
            Value::BulkString(b"body".to_vec()),
            Value::Int(60),
        ])
    }

    /// The id argument of a `give_back`, as the call would carry it.
    fn id_arg(op: &Op) -> Vec<u8> {
        let [Arg::Owner(7), id] = &op.args[..] else {
            panic!("give_back takes the owner and the id");
        };
        let mut cmd = redis::cmd("FCALL");
        id.write(&mut cmd, "p", &mut String::new());
        cmd.args_iter()
            .skip(1)
            .find_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
                _ => None,
            })
            .expect("the id")
    }

    #[test]
    fn a_late_reservation_goes_back_by_the_id_the_scripts_take() {
        let op = give_back(7, reply(Value::Int(26))).expect("a job to give back");
        assert_eq!((op.name, op.kind), ("give_back", Kind::Moves));
        assert_eq!(id_arg(&op), b"#00000000001a");
        let op = give_back(7, reply(Value::BulkString(b"order-close:4711".to_vec())))
            .expect("a job to give back");
        assert_eq!(id_arg(&op), b"order-close:4711");
        // A reserve that took nothing leaves nothing to give back.
        assert!(give_back(7, Value::Boolean(false)).is_none());
        assert!(give_back(7, Value::Nil).is_none());
    }

    #[test]
    fn every_job_of_a_late_batch_goes_back() {
        let many = Reserver {
            conn: 7,
            many: true,
        };
        let batch = Value::Array(vec![
            reply(Value::Int(26)),
            reply(Value::BulkString(b"order-close:4711".to_vec())),
        ]);
        let ops = give_back_all(many, batch);
        let ids: Vec<Vec<u8>> = ops.iter().map(id_arg).collect();
        assert_eq!(
            ids,
            [b"#00000000001a".to_vec(), b"order-close:4711".to_vec()]
        );
        assert!(give_back_all(many, Value::Array(Vec::new())).is_empty());
        let one = Reserver {
            conn: 7,
            many: false,
        };
        assert_eq!(give_back_all(one, reply(Value::Int(26))).len(), 1);
        assert!(give_back_all(one, Value::Nil).is_empty());
    }

    #[test]
    fn operations_nobody_waits_for_are_dropped_unsent_and_uncounted() {
        let (tx, mut queue) = mpsc::unbounded_channel();
        let op = |unheard| {
            let (reply, result) = oneshot::channel();
            let op = Op {
                kind: Kind::Puts,
                name: "put",
                args: vec![Arg::Static("default")],
                reply,
                unheard,
            };
            (op, result)
        };
        // A frozen Redis's worth of puts whose commands ran out of time.
        for _ in 0..MAX_BATCH * 3 {
            tx.send(op(false).0).unwrap();
        }
        let (live, _waiting) = op(false);
        tx.send(live).unwrap();
        // A give-back: nobody waits for its reply, and it must go.
        tx.send(op(true).0).unwrap();
        let mut ops = Vec::new();
        assert!(take_queued(&mut queue, &mut ops));
        assert_eq!(ops.len(), 2, "the live put and the give-back");
        assert!(!ops[0].unheard && ops[1].unheard);
        assert!(queue.is_empty());
        drop(tx);
        assert!(!take_queued(&mut queue, &mut Vec::new()), "closed");
    }

    #[test]
    fn only_reserving_operations_name_a_reserver() {
        let (reply, _) = oneshot::channel();
        let reserve = Op {
            kind: Kind::Moves,
            name: "reserve",
            args: vec![Arg::Owner(3), Arg::Static("default")],
            reply,
            unheard: false,
        };
        assert_eq!(
            reserver(&reserve),
            Some(Reserver {
                conn: 3,
                many: false
            })
        );
        let (reply, _) = oneshot::channel();
        let batch = Op {
            kind: Kind::Moves,
            name: "reserve_many",
            args: vec![Arg::Owner(3), Arg::Static("default"), Arg::Int(5)],
            reply,
            unheard: false,
        };
        assert_eq!(
            reserver(&batch),
            Some(Reserver {
                conn: 3,
                many: true
            })
        );
        let (reply, _) = oneshot::channel();
        let delete = Op {
            kind: Kind::Moves,
            name: "delete",
            args: vec![Arg::Owner(3), Arg::Static("#1"), Arg::Static("delete")],
            reply,
            unheard: false,
        };
        assert_eq!(reserver(&delete), None);
    }
}
