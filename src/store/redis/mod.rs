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

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, RedisError, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{info, warn};

mod batch;
mod library;

pub use library::bench_call;

use batch::{Arg, Op};
use library::{Kind, Library};

use super::{
    ConnId, Counts, JobState, JobStats, NewJob, PutOutcome, Reserved, Store, StoreEvent,
    StoreStats, Tick, TubeRef, TubeStats, secs_left,
};
use crate::error::{StoreError, StoreResult};
use crate::names::{JobId, Tube};
use crate::reply::JobBody;

/// Most jobs one script call moves (a kick, a disconnect), so no call
/// blocks Redis for long.
const BATCH: u64 = 1000;
/// Most jobs one tick moves. Smaller than [`BATCH`]: ticks run while
/// workers wait for the jobs they move, and calls queued behind a tick wait
/// for all of it.
const TICK_BATCH: u64 = 250;
/// How long a Redis call may take before it fails with `INTERNAL_ERROR`.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the event listener retries while Redis is unreachable.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// The timer's longest sleep: each tick renews this process's alive mark
/// (which expires after 3 s), and catches a due time another process created
/// but could not announce.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// The Redis storage engine.
pub struct RedisStore {
    /// Distinguishes this process's connections from other processes'.
    process: String,
    /// The operations waiting for the next call.
    queue: mpsc::UnboundedSender<Op>,
    events: Mutex<Option<mpsc::Receiver<StoreEvent>>>,
    /// Stops the event listener when the store is dropped.
    _listener: DropGuard,
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

/// A job id as the scripts return it: a server id as a number, a
/// client-chosen one as text.
fn job_id(v: Value) -> StoreResult<JobId> {
    match v {
        Value::Int(n) => u64::try_from(n)
            .map(JobId::Server)
            .map_err(|_| corrupt("job id")),
        Value::BulkString(raw) => JobId::parse(&raw).ok_or_else(|| corrupt("job id")),
        _ => Err(corrupt("job id")),
    }
}

fn tube(raw: &str) -> StoreResult<Tube> {
    Tube::parse(raw.as_bytes()).ok_or_else(|| corrupt("tube name"))
}

/// A tube name as the scripts return it; one of `known` if it is one, so
/// that the usual reply costs no allocation.
fn returned_tube(v: Value, known: &[Tube]) -> StoreResult<Tube> {
    let Value::BulkString(raw) = v else {
        return Err(corrupt("tube name"));
    };
    match known
        .iter()
        .find(|t| t.as_str().as_bytes() == raw.as_slice())
    {
        Some(t) => Ok(t.clone()),
        None => Tube::parse(&raw).ok_or_else(|| corrupt("tube name")),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A job as the scripts return it, `{id, tube, body, ...}`, or nothing;
/// what follows the body is left in `rest`.
fn job_body(v: Value, known: &[Tube]) -> StoreResult<Option<(JobBody, Vec<Value>)>> {
    let fields = match v {
        Value::Nil => return Ok(None),
        Value::Array(fields) => fields,
        _ => return Err(corrupt("a job")),
    };
    let mut fields = fields.into_iter();
    let (Some(id), Some(t), Some(Value::BulkString(body))) =
        (fields.next(), fields.next(), fields.next())
    else {
        return Err(corrupt("a job"));
    };
    let job = JobBody {
        id: job_id(id)?,
        tube: returned_tube(t, known)?,
        body: Bytes::from(body),
    };
    Ok(Some((job, fields.collect())))
}

fn reserved(v: Value, known: &[Tube]) -> StoreResult<Option<Reserved>> {
    let Some((job, rest)) = job_body(v, known)? else {
        return Ok(None);
    };
    let [ttr] = <[Value; 1]>::try_from(rest).map_err(|_| corrupt("a reserved job"))?;
    Ok(Some(Reserved {
        job,
        ttr: Duration::from_millis(parse(ttr)?),
    }))
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
        let library = Library::new();
        batch::load(&mut conn, &library).await.map_err(fail)?;
        let (queue, ops) = mpsc::unbounded_channel();
        tokio::spawn(batch::run(conn, tag, process.clone(), library, ops));
        let store = RedisStore {
            process,
            queue,
            events: Mutex::new(Some(rx)),
            _listener: stop.drop_guard(),
        };
        // Counted among the live processes before any connection attaches
        // to a tube.
        store.tick().await?;
        Ok(store)
    }

    /// Runs the operation `name` with `args` in the next call.
    async fn op(&self, kind: Kind, name: &'static str, args: Vec<Arg>) -> StoreResult<Value> {
        let (reply, result) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the batch sender has stopped".into());
        self.queue
            .send(Op {
                kind,
                name,
                args,
                reply,
            })
            .map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }

    /// A move of existing jobs (or any write that is not a put).
    async fn write<T: FromRedisValue>(&self, name: &'static str, args: Vec<Arg>) -> StoreResult<T> {
        parse(self.op(Kind::Moves, name, args).await?)
    }

    /// A read.
    async fn read<T: FromRedisValue>(&self, name: &'static str, args: Vec<Arg>) -> StoreResult<T> {
        parse(self.op(Kind::Reads, name, args).await?)
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
        let name = job.id.clone();
        let args = vec![
            Arg::Tube(job.tube),
            match &job.id {
                Some(name) => Arg::Text(name.to_string()),
                None => Arg::Static(""),
            },
            Arg::Int(job.pri.into()),
            Arg::Int(millis(job.delay)),
            Arg::Int(millis(job.ttr)),
            Arg::Body(job.body),
        ];
        let got = self.op(Kind::Puts, "put", args).await?;
        match (got, name) {
            (Value::Int(0), Some(name)) => Ok(PutOutcome::Exists(JobId::Client(name))),
            (Value::BulkString(_), Some(name)) => Ok(PutOutcome::Inserted(JobId::Client(name))),
            (got @ Value::Int(_), None) => Ok(PutOutcome::Inserted(job_id(got)?)),
            _ => Err(corrupt("put")),
        }
    }

    async fn reserve(&self, conn: ConnId, tubes: &[Tube]) -> StoreResult<Option<Reserved>> {
        let names = match tubes {
            [one] => Arg::Tube(one.clone()),
            _ => Arg::Text(tubes.iter().map(Tube::as_str).collect::<Vec<_>>().join(" ")),
        };
        let got = self
            .op(Kind::Moves, "reserve", vec![Arg::Owner(conn), names])
            .await?;
        reserved(got, tubes)
    }

    async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        let args = vec![Arg::Owner(conn), Arg::Id(id.clone())];
        reserved(self.op(Kind::Moves, "reserve_job", args).await?, &[])
    }

    async fn give_back(&self, conn: ConnId, id: &JobId) -> StoreResult<()> {
        let args = vec![Arg::Owner(conn), Arg::Id(id.clone())];
        self.write::<i64>("give_back", args).await.map(drop)
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
        let args = vec![
            Arg::Owner(conn),
            Arg::Id(id.clone()),
            Arg::Int(pri.into()),
            Arg::Int(millis(delay)),
        ];
        let t: Option<String> = self.write("release", args).await?;
        t.as_deref().map(tube).transpose()
    }

    async fn bury(&self, conn: ConnId, id: &JobId, pri: u32) -> StoreResult<bool> {
        let args = vec![Arg::Owner(conn), Arg::Id(id.clone()), Arg::Int(pri.into())];
        let n: i64 = self.write("bury", args).await?;
        Ok(n == 1)
    }

    async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        let args = vec![Arg::Owner(conn), Arg::Id(id.clone())];
        let ttr: Option<u64> = self.write("touch", args).await?;
        Ok(ttr.map(Duration::from_millis))
    }

    async fn kick(&self, t: &Tube, bound: u64) -> StoreResult<u64> {
        let (mut kicked, mut kind) = (0, String::new());
        while kicked < bound {
            let batch = (bound - kicked).min(BATCH);
            let args = vec![Arg::Tube(t.clone()), Arg::Int(batch), Arg::Text(kind)];
            let (n, k): (u64, String) = self.write("kick", args).await?;
            kicked += n;
            kind = k;
            if n < batch {
                break;
            }
        }
        Ok(kicked)
    }

    async fn kick_job(&self, id: &JobId) -> StoreResult<Option<Tube>> {
        let t: Option<String> = self.write("kick_job", vec![Arg::Id(id.clone())]).await?;
        t.as_deref().map(tube).transpose()
    }

    async fn peek(&self, id: &JobId) -> StoreResult<Option<JobBody>> {
        self.peek_by("id", Arg::Id(id.clone()), &[]).await
    }

    async fn peek_ready(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_by("ready", Arg::Tube(t.clone()), std::slice::from_ref(t))
            .await
    }

    async fn peek_delayed(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_by("delayed", Arg::Tube(t.clone()), std::slice::from_ref(t))
            .await
    }

    async fn peek_buried(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_by("buried", Arg::Tube(t.clone()), std::slice::from_ref(t))
            .await
    }

    async fn stats_job(&self, id: &JobId) -> StoreResult<Option<JobStats>> {
        let got: Option<Vec<Value>> = self.read("stats_job", vec![Arg::Id(id.clone())]).await?;
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
            id: job_id(id)?,
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
        let got: Option<Vec<u64>> = self.read("stats_tube", vec![Arg::Tube(t.clone())]).await?;
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
        let v: Vec<u64> = self.read("stats", Vec::new()).await?;
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
        let names: Vec<String> = self.read("list_tubes", Vec::new()).await?;
        names.iter().map(|n| tube(n)).collect()
    }

    async fn pause_tube(&self, t: &Tube, delay: Duration) -> StoreResult<bool> {
        let args = vec![Arg::Tube(t.clone()), Arg::Int(millis(delay))];
        let n: i64 = self.write("pause_tube", args).await?;
        Ok(n == 1)
    }

    async fn release_all(&self, conn: ConnId, held: &[JobId]) -> StoreResult<Vec<Tube>> {
        let mut tubes = Vec::new();
        for chunk in held.chunks(BATCH as usize) {
            let ids = chunk
                .iter()
                .map(|id| match id {
                    JobId::Server(n) => format!("#{n:012x}"),
                    JobId::Client(name) => name.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" ");
            let args = vec![Arg::Owner(conn), Arg::Text(ids)];
            let got: Vec<String> = self.write("release_all", args).await?;
            for t in got {
                let t = tube(&t)?;
                if !tubes.contains(&t) {
                    tubes.push(t);
                }
            }
        }
        Ok(tubes)
    }

    async fn tick(&self) -> StoreResult<Tick> {
        let args = vec![Arg::Int(TICK_BATCH), Arg::Text(self.process.clone())];
        let v: Vec<Value> = self.write("tick", args).await?;
        let mut v = v.into_iter();
        let next: i64 = parse(v.next().ok_or_else(|| corrupt("tick"))?)?;
        let ready = v
            .map(|t| parse::<String>(t).and_then(|t| tube(&t)))
            .collect::<StoreResult<_>>()?;
        Ok(Tick {
            ready,
            next: u64::try_from(next).ok().map(Duration::from_micros),
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
    async fn remove(&self, conn: ConnId, id: &JobId, mode: &'static str) -> StoreResult<bool> {
        let args = vec![Arg::Owner(conn), Arg::Id(id.clone()), Arg::Static(mode)];
        let n: i64 = self.write("delete", args).await?;
        Ok(n == 1)
    }

    /// `peek` by id (`mode` "id") or the first job of a tube's state index;
    /// `known` are tubes the job may be in.
    async fn peek_by(
        &self,
        mode: &'static str,
        arg: Arg,
        known: &[Tube],
    ) -> StoreResult<Option<JobBody>> {
        let got = self
            .op(Kind::Reads, "peek", vec![Arg::Static(mode), arg])
            .await?;
        Ok(job_body(got, known)?.map(|(job, _)| job))
    }

    async fn tube_ref(&self, t: &Tube, how: TubeRef, delta: i64) -> StoreResult<()> {
        let field = match how {
            TubeRef::Using => "u",
            TubeRef::Watching => "w",
        };
        let args = vec![
            Arg::Text(self.process.clone()),
            Arg::Tube(t.clone()),
            Arg::Static(field),
            Arg::Text(delta.to_string()),
        ];
        self.write::<i64>("tube_ref", args).await.map(drop)
    }
}
