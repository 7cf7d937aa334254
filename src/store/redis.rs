//! The Redis engine: the job pool, delay buckets and ready queues live in
//! Redis, so jobs survive a delayq restart and several delayq processes can
//! share one Redis.
//!
//! Every transition is one Lua script (`lua/*.lua`, each prefixed with
//! `lua/prelude.lua`), loaded once and called by hash, so no state is ever
//! read and written back across round trips. Times come from Redis's own
//! clock inside the scripts, so processes on different hosts agree on when a
//! job is due. All calls share one multiplexed connection that reconnects by
//! itself; a second connection listens on the `events` channel, where the
//! scripts announce tubes that got ready jobs, so a job made ready by one
//! process reaches a worker blocked on another.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, RedisError, Script, Value};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{info, warn};

use super::{
    ConnId, Counts, JobState, JobStats, NewJob, PutOutcome, Reserved, Store, StoreEvent,
    StoreStats, Tick, TubeRef, TubeStats, secs_left,
};
use crate::error::{StoreError, StoreResult};
use crate::names::{JobId, Tube};
use crate::reply::JobBody;

/// Most jobs one script call moves (a tick, a kick, a disconnect), so no
/// call blocks Redis for long.
const BATCH: u64 = 1000;
/// How long a Redis call may take before it fails with `INTERNAL_ERROR`.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the event listener retries while Redis is unreachable.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// The timer's longest sleep: each tick renews this process's alive mark
/// (which expires after 3 s), and catches a due time another process created
/// but could not announce.
const MAX_SLEEP: Duration = Duration::from_secs(1);

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// A transition's script file, to be run inside a function whose parameter
/// is `ARGV`: whole, as its own script, or as one of the transitions of a
/// batch.
macro_rules! body {
    ($name:ident) => {
        include_str!(concat!("lua/", stringify!($name), ".lua"))
    };
}

/// The text of a script running one transition.
fn single(flags: &str, body: &str) -> String {
    format!(
        "#!lua{flags}\n{PRELUDE}\nlocal function run(ARGV)\n{body}\nend\n\
         local result = run(ARGV)\nflush()\nreturn result\n"
    )
}

/// The text of a script running any number of the transitions `ops`.
fn batch(flags: &str, ops: &[(&str, &str)]) -> String {
    let mut text = format!("#!lua{flags}\n{PRELUDE}\nlocal OPS = {{}}\n");
    for (name, body) in ops {
        text.push_str(&format!("OPS['{name}'] = function(ARGV)\n{body}\nend\n"));
    }
    text.push_str(include_str!("lua/batch.lua"));
    text
}

macro_rules! scripts {
    ($($name:ident: $flags:literal),+ $(,)?) => {
        /// One loaded script per transition.
        struct Scripts { $($name: Script,)+ }

        impl Scripts {
            fn load() -> Scripts {
                Scripts { $($name: Script::new(&single($flags, body!($name))),)+ }
            }
        }
    };
}

// The flags decide what Redis does when it is over `maxmemory`. A script
// without flags is refused whole, up front, so a put never leaves a job half
// written. Reads (`no-writes`) and moves of existing jobs (`allow-oom`: they
// free memory or barely change it) still run, so workers can drain a full
// Redis.
scripts!(
    kick: " flags=allow-oom",
    kick_job: " flags=allow-oom",
    peek: " flags=no-writes",
    stats_job: " flags=no-writes",
    stats_tube: " flags=no-writes",
    stats: " flags=no-writes",
    pause_tube: " flags=allow-oom",
    release_all: " flags=allow-oom",
    tick: " flags=allow-oom",
    tube_ref: " flags=allow-oom",
);

/// The batch scripts: puts, refused whole when Redis is out of memory, and
/// the moves of existing jobs, which are not.
struct Batches {
    puts: Script,
    moves: Script,
}

impl Batches {
    fn load() -> Batches {
        Batches {
            puts: Script::new(&batch("", &[("put", body!(put))])),
            moves: Script::new(&batch(
                " flags=allow-oom",
                &[
                    ("reserve", body!(reserve)),
                    ("reserve_job", body!(reserve_job)),
                    ("give_back", body!(give_back)),
                    ("delete", body!(delete)),
                    ("release", body!(release)),
                    ("bury", body!(bury)),
                    ("touch", body!(touch)),
                ],
            )),
        }
    }
}

/// Most transitions one batch carries, so that no call holds Redis long.
const MAX_BATCH: usize = 256;

/// Most batches in Redis at once.
const IN_FLIGHT: usize = 4;

/// A transition waiting for the next batch.
struct Op {
    name: &'static str,
    args: Vec<Vec<u8>>,
    reply: oneshot::Sender<StoreResult<Value>>,
}

/// The Redis storage engine.
pub struct RedisStore {
    conn: ConnectionManager,
    /// The key prefix in braces, so every key shares one hash tag.
    tag: String,
    /// Distinguishes this process's connections from other processes'.
    process: String,
    scripts: Scripts,
    /// The transitions waiting for the next batch.
    queue: mpsc::UnboundedSender<Op>,
    events: Mutex<Option<mpsc::Receiver<StoreEvent>>>,
    /// Stops the event listener when the store is dropped.
    _listener: DropGuard,
}

/// Script arguments, each turned into the bytes Redis receives.
macro_rules! args {
    ($($arg:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut args: Vec<Vec<u8>> = Vec::new();
        $(args.extend(redis::ToRedisArgs::to_redis_args($arg));)*
        args
    }};
}

fn fail(e: RedisError) -> StoreError {
    if e.code() == Some("OOM") {
        StoreError::OutOfMemory
    } else {
        StoreError::Unavailable(e.to_string())
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Unavailable(format!("unexpected reply from Redis: {what}"))
}

fn parse<T: FromRedisValue>(v: Value) -> StoreResult<T> {
    redis::from_redis_value(v).map_err(|e| corrupt(&e.to_string()))
}

fn job_id(raw: &str) -> StoreResult<JobId> {
    JobId::parse(raw.as_bytes()).ok_or_else(|| corrupt("job id"))
}

fn tube(raw: &str) -> StoreResult<Tube> {
    Tube::parse(raw.as_bytes()).ok_or_else(|| corrupt("tube name"))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn job_body((id, t, body): (String, String, Vec<u8>)) -> StoreResult<JobBody> {
    Ok(JobBody {
        id: job_id(&id)?,
        tube: tube(&t)?,
        body: Bytes::from(body),
    })
}

fn reserved(got: Option<(String, String, Vec<u8>, u64)>) -> StoreResult<Option<Reserved>> {
    got.map(|(id, t, body, ttr)| {
        Ok(Reserved {
            job: job_body((id, t, body))?,
            ttr: Duration::from_millis(ttr),
        })
    })
    .transpose()
}

impl RedisStore {
    /// Connects to the Redis at `url` and keeps its keys under `prefix`.
    ///
    /// Warns loudly if Redis may evict keys, since an evicted key is a lost job.
    pub async fn connect(url: &str, prefix: &str) -> StoreResult<RedisStore> {
        let client = redis::Client::open(url).map_err(fail)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT))
            .set_number_of_retries(2);
        let mut conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(fail)?;
        let tag = format!("{{{prefix}}}");
        redis::cmd("ZADD")
            .arg(format!("{tag}tubes"))
            .arg("NX")
            .arg(0)
            .arg("default")
            .query_async::<()>(&mut conn)
            .await
            .map_err(fail)?;
        warn_if_evicting(&mut conn).await;
        let (tx, rx) = mpsc::channel(1024);
        let stop = CancellationToken::new();
        tokio::spawn(listen(client, format!("{tag}events"), tx, stop.clone()));
        let process = format!(
            "{:016x}",
            std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id())
        );
        let (queue, ops) = mpsc::unbounded_channel();
        tokio::spawn(run_batches(conn.clone(), tag.clone(), Batches::load(), ops));
        Ok(RedisStore {
            conn,
            tag,
            process,
            scripts: Scripts::load(),
            queue,
            events: Mutex::new(Some(rx)),
            _listener: stop.drop_guard(),
        })
    }

    fn owner(&self, conn: ConnId) -> String {
        format!("{}:{conn}", self.process)
    }

    /// Runs `script` with the key prefix and then `args` as ARGV.
    async fn call<T: FromRedisValue>(&self, script: &Script, args: Vec<Vec<u8>>) -> StoreResult<T> {
        let mut invocation = script.prepare_invoke();
        // One declared key, so a cluster-aware client routes the call to the
        // node of the prefix's hash slot, where every key it touches lives.
        invocation.key(format!("{}jobs", self.tag));
        invocation.arg(&self.tag);
        for arg in args {
            invocation.arg(arg);
        }
        let mut conn = self.conn.clone();
        invocation.invoke_async(&mut conn).await.map_err(fail)
    }

    /// Runs the transition `name` with `args` in the next batch.
    async fn op<T: FromRedisValue>(
        &self,
        name: &'static str,
        args: Vec<Vec<u8>>,
    ) -> StoreResult<T> {
        let (reply, result) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the batch sender has stopped".into());
        self.queue
            .send(Op { name, args, reply })
            .map_err(|_| stopped())?;
        parse(result.await.map_err(|_| stopped())??)
    }
}

/// Sends the transitions queued on `queue` in batches: whatever queued since
/// the last batch went out goes into the next, so under load many commands
/// share one call, while a lone command waits for nothing. Up to
/// `IN_FLIGHT` batches are in Redis at once, pipelined on the one
/// connection, so a command never waits for an earlier batch to come back.
async fn run_batches(
    conn: ConnectionManager,
    tag: String,
    batches: Batches,
    mut queue: mpsc::UnboundedReceiver<Op>,
) {
    let (tag, batches) = (Arc::<str>::from(tag), Arc::new(batches));
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut ops = Vec::with_capacity(MAX_BATCH);
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        if queue.recv_many(&mut ops, MAX_BATCH).await == 0 {
            return;
        }
        let (puts, moves): (Vec<Op>, Vec<Op>) = ops.drain(..).partition(|op| op.name == "put");
        let (conn, tag, batches) = (conn.clone(), tag.clone(), batches.clone());
        tokio::spawn(async move {
            tokio::join!(
                send(&conn, &tag, &batches.puts, puts),
                send(&conn, &tag, &batches.moves, moves),
            );
            drop(permit);
        });
    }
}

/// Runs `ops` in one call of `script` and hands each its own result.
async fn send(conn: &ConnectionManager, tag: &str, script: &Script, ops: Vec<Op>) {
    if ops.is_empty() {
        return;
    }
    let mut invocation = script.prepare_invoke();
    invocation.key(format!("{tag}jobs"));
    invocation.arg(tag);
    let mut replies = Vec::with_capacity(ops.len());
    for op in ops {
        invocation.arg(op.name).arg(op.args.len());
        for arg in op.args {
            invocation.arg(arg);
        }
        replies.push(op.reply);
    }
    let mut conn = conn.clone();
    match invocation.invoke_async::<Vec<Value>>(&mut conn).await {
        Ok(results) if results.len() == replies.len() => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(outcome(result));
            }
        }
        Ok(_) => {
            for reply in replies {
                let _ = reply.send(Err(corrupt("batch length")));
            }
        }
        Err(e) => {
            let e = fail(e);
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// One transition's entry in a batch's reply: `{1, result}` or `{0, error}`.
fn outcome(entry: Value) -> StoreResult<Value> {
    let (ok, result): (i64, Value) = parse(entry)?;
    if ok == 1 {
        Ok(result)
    } else {
        Err(StoreError::Unavailable(
            parse::<String>(result).unwrap_or_else(|e| e.to_string()),
        ))
    }
}

async fn warn_if_evicting(conn: &mut ConnectionManager) {
    let policy: Result<(String, String), _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    match policy {
        Ok((_, policy)) if policy != "noeviction" => warn!(
            %policy,
            "REDIS MAY EVICT KEYS: maxmemory-policy is not noeviction, so jobs can be lost \
             when Redis is full; set `maxmemory-policy noeviction`"
        ),
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot read maxmemory-policy; make sure it is noeviction"),
    }
}

/// Listens on the events channel until `stop`, reconnecting as needed.
async fn listen(
    client: redis::Client,
    channel: String,
    tx: mpsc::Sender<StoreEvent>,
    stop: CancellationToken,
) {
    let mut connected_before = false;
    loop {
        let session = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            if connected_before {
                info!("Redis events channel back");
            }
            // Whatever was announced while we were away is caught up here.
            let _ = tx.send(StoreEvent::Resync).await;
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let payload = msg.get_payload_bytes();
                let event = match payload.strip_prefix(b"due:") {
                    Some(ms) => crate::names::parse_u64(ms)
                        .map(|ms| StoreEvent::Due(Duration::from_millis(ms))),
                    None => Tube::parse(payload).map(StoreEvent::Ready),
                };
                if let Some(event) = event {
                    let _ = tx.send(event).await;
                }
            }
            Ok::<(), RedisError>(())
        };
        tokio::select! {
            ended = session => match ended {
                Ok(()) => warn!("Redis events channel closed; reconnecting"),
                Err(e) => warn!(error = %e, "Redis events channel unavailable; retrying"),
            },
            () = stop.cancelled() => return,
        }
        connected_before = true;
        tokio::select! {
            () = tokio::time::sleep(RECONNECT_DELAY) => {}
            () = stop.cancelled() => return,
        }
    }
}

impl Store for RedisStore {
    async fn put(&self, job: NewJob) -> StoreResult<PutOutcome> {
        let name = job.id.as_deref().unwrap_or("");
        let (inserted, id): (i64, String) = self
            .op(
                "put",
                args![
                    &job.tube.as_str(),
                    &name,
                    &job.pri,
                    &millis(job.delay),
                    &millis(job.ttr),
                    &job.body.as_ref(),
                ],
            )
            .await?;
        let id = job_id(&id)?;
        Ok(if inserted == 1 {
            PutOutcome::Inserted(id)
        } else {
            PutOutcome::Exists(id)
        })
    }

    async fn reserve(&self, conn: ConnId, tubes: &[Tube]) -> StoreResult<Option<Reserved>> {
        let owner = self.owner(conn);
        let mut args = args![&owner];
        args.extend(tubes.iter().map(|t| t.as_str().as_bytes().to_vec()));
        reserved(self.op("reserve", args).await?)
    }

    async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        let (owner, id) = (self.owner(conn), id.to_string());
        reserved(self.op("reserve_job", args![&owner, &id]).await?)
    }

    async fn give_back(&self, conn: ConnId, id: &JobId) -> StoreResult<()> {
        let (owner, id) = (self.owner(conn), id.to_string());
        self.op::<i64>("give_back", args![&owner, &id])
            .await
            .map(drop)
    }

    async fn delete(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        self.remove(conn, id, "delete").await
    }

    async fn finish(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        self.remove(conn, id, "finish").await
    }

    async fn release(
        &self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        delay: Duration,
    ) -> StoreResult<Option<Tube>> {
        let (owner, id) = (self.owner(conn), id.to_string());
        let t: Option<String> = self
            .op("release", args![&owner, &id, &pri, &millis(delay)])
            .await?;
        t.as_deref().map(tube).transpose()
    }

    async fn bury(&self, conn: ConnId, id: &JobId, pri: u32) -> StoreResult<bool> {
        let (owner, id) = (self.owner(conn), id.to_string());
        let n: i64 = self.op("bury", args![&owner, &id, &pri]).await?;
        Ok(n == 1)
    }

    async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        let (owner, id) = (self.owner(conn), id.to_string());
        let ttr: Option<u64> = self.op("touch", args![&owner, &id]).await?;
        Ok(ttr.map(Duration::from_millis))
    }

    async fn kick(&self, t: &Tube, bound: u64) -> StoreResult<u64> {
        let (mut kicked, mut kind) = (0, String::new());
        while kicked < bound {
            let batch = (bound - kicked).min(BATCH);
            let (n, k): (u64, String) = self
                .call(&self.scripts.kick, args![&t.as_str(), &batch, &kind])
                .await?;
            kicked += n;
            kind = k;
            if n < batch {
                break;
            }
        }
        Ok(kicked)
    }

    async fn kick_job(&self, id: &JobId) -> StoreResult<Option<Tube>> {
        let id = id.to_string();
        let t: Option<String> = self.call(&self.scripts.kick_job, args![&id]).await?;
        t.as_deref().map(tube).transpose()
    }

    async fn peek(&self, id: &JobId) -> StoreResult<Option<JobBody>> {
        self.peek_by("id", &id.to_string()).await
    }

    async fn peek_ready(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_by("ready", t.as_str()).await
    }

    async fn peek_delayed(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_by("delayed", t.as_str()).await
    }

    async fn peek_buried(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_by("buried", t.as_str()).await
    }

    async fn stats_job(&self, id: &JobId) -> StoreResult<Option<JobStats>> {
        let id = id.to_string();
        let got: Option<Vec<Value>> = self.call(&self.scripts.stats_job, args![&id]).await?;
        let Some(v) = got else {
            return Ok(None);
        };
        let [
            id,
            t,
            state,
            pri,
            age,
            delay,
            ttr,
            left,
            reserves,
            timeouts,
            releases,
            buries,
            kicks,
        ] = <[Value; 13]>::try_from(v).map_err(|_| corrupt("stats-job"))?;
        let secs = |v: Value| parse::<u64>(v).map(|ms| ms / 1000);
        let state = match parse::<String>(state)?.as_str() {
            "ready" => JobState::Ready,
            "delayed" => JobState::Delayed,
            "reserved" => JobState::Reserved,
            "buried" => JobState::Buried,
            _ => return Err(corrupt("job state")),
        };
        Ok(Some(JobStats {
            id: job_id(&parse::<String>(id)?)?,
            tube: tube(&parse::<String>(t)?)?,
            state,
            pri: parse(pri)?,
            age: secs(age)?,
            delay: secs(delay)?,
            ttr: secs(ttr)?,
            time_left: secs_left(parse(left)?),
            reserves: parse(reserves)?,
            timeouts: parse(timeouts)?,
            releases: parse(releases)?,
            buries: parse(buries)?,
            kicks: parse(kicks)?,
        }))
    }

    async fn stats_tube(&self, t: &Tube) -> StoreResult<Option<TubeStats>> {
        let got: Option<Vec<u64>> = self
            .call(&self.scripts.stats_tube, args![&t.as_str()])
            .await?;
        let Some(v) = got else {
            return Ok(None);
        };
        let [
            urgent,
            ready,
            reserved,
            delayed,
            buried,
            total,
            using,
            watching,
            del,
            pauses,
            pause,
            left,
        ] = <[u64; 12]>::try_from(v).map_err(|_| corrupt("stats-tube"))?;
        Ok(Some(TubeStats {
            name: t.clone(),
            counts: Counts {
                urgent,
                ready,
                reserved,
                delayed,
                buried,
            },
            total_jobs: total,
            using,
            watching,
            cmd_delete: del,
            cmd_pause_tube: pauses,
            pause: pause / 1000,
            pause_time_left: secs_left(left),
        }))
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        let v: Vec<u64> = self.call(&self.scripts.stats, args![]).await?;
        let [
            urgent,
            ready,
            reserved,
            delayed,
            buried,
            timeouts,
            total,
            tubes,
        ] = <[u64; 8]>::try_from(v).map_err(|_| corrupt("stats"))?;
        Ok(StoreStats {
            counts: Counts {
                urgent,
                ready,
                reserved,
                delayed,
                buried,
            },
            job_timeouts: timeouts,
            total_jobs: total,
            tubes,
        })
    }

    async fn list_tubes(&self) -> StoreResult<Vec<Tube>> {
        let mut conn = self.conn.clone();
        let names: Vec<String> = redis::cmd("ZRANGE")
            .arg(format!("{}tubes", self.tag))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(fail)?;
        names.iter().map(|n| tube(n)).collect()
    }

    async fn pause_tube(&self, t: &Tube, delay: Duration) -> StoreResult<bool> {
        let n: i64 = self
            .call(&self.scripts.pause_tube, args![&t.as_str(), &millis(delay)])
            .await?;
        Ok(n == 1)
    }

    async fn release_all(&self, conn: ConnId) -> StoreResult<Vec<Tube>> {
        let owner = self.owner(conn);
        let mut tubes = Vec::new();
        loop {
            let v: Vec<Value> = self
                .call(&self.scripts.release_all, args![&owner, &BATCH])
                .await?;
            let mut v = v.into_iter();
            let n: u64 = parse(v.next().ok_or_else(|| corrupt("release-all"))?)?;
            for t in v {
                let t = tube(&parse::<String>(t)?)?;
                if !tubes.contains(&t) {
                    tubes.push(t);
                }
            }
            if n < BATCH {
                return Ok(tubes);
            }
        }
    }

    async fn tick(&self) -> StoreResult<Tick> {
        let v: Vec<Value> = self
            .call(&self.scripts.tick, args![&BATCH, &self.process])
            .await?;
        let mut v = v.into_iter();
        let next: i64 = parse(v.next().ok_or_else(|| corrupt("tick"))?)?;
        let ready = v
            .map(|t| parse::<String>(t).and_then(|t| tube(&t)))
            .collect::<StoreResult<_>>()?;
        Ok(Tick {
            ready,
            next: u64::try_from(next).ok().map(Duration::from_millis),
        })
    }

    async fn attach(&self, t: &Tube, how: TubeRef) -> StoreResult<()> {
        self.tube_ref(t, how, 1).await
    }

    async fn detach(&self, t: &Tube, how: TubeRef) -> StoreResult<()> {
        self.tube_ref(t, how, -1).await
    }

    fn events(&self) -> Option<mpsc::Receiver<StoreEvent>> {
        self.events.lock().ok()?.take()
    }

    fn max_sleep(&self) -> Option<Duration> {
        Some(MAX_SLEEP)
    }
}

impl RedisStore {
    /// `delete` or `finish` (`mode`), one script with the rule as argument.
    async fn remove(&self, conn: ConnId, id: &JobId, mode: &str) -> StoreResult<bool> {
        let (owner, id) = (self.owner(conn), id.to_string());
        let n: i64 = self.op("delete", args![&owner, &id, &mode]).await?;
        Ok(n == 1)
    }

    /// `peek` by id (`mode` "id") or the first job of a tube's state index.
    async fn peek_by(&self, mode: &str, arg: &str) -> StoreResult<Option<JobBody>> {
        let got: Option<_> = self.call(&self.scripts.peek, args![&mode, &arg]).await?;
        got.map(job_body).transpose()
    }

    async fn tube_ref(&self, t: &Tube, how: TubeRef, delta: i64) -> StoreResult<()> {
        let field = match how {
            TubeRef::Using => "u",
            TubeRef::Watching => "w",
        };
        self.call::<i64>(
            &self.scripts.tube_ref,
            args![&self.process, &t.as_str(), &field, &delta],
        )
        .await
        .map(drop)
    }
}
