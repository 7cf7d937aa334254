//! The Redis engine: the job pool, delay buckets and ready queues live in
//! Redis, so jobs survive a delayq restart and several delayq processes can
//! share one Redis.
//!
//! * `connect.rs`: reaching Redis and checking it (eviction policy, library);
//! * `library.rs`: the Lua function library (`src/store/lua/`), one
//!   operation per transition, put together once;
//! * `batch.rs`: concurrent operations of many connections share one
//!   function call, pipelined on one multiplexed connection;
//! * `events.rs`: what other processes announce (tubes with ready jobs,
//!   earlier due times);
//! * `decode.rs`: replies into the domain's types;
//! * this file: the [`Store`] over them.
//!
//! No state is ever read and written back across round trips: each
//! transition is one operation inside one call. Times come from Redis's own
//! clock inside the functions, so processes on different hosts agree on when
//! a job is due.

use std::sync::Mutex;
use std::time::Duration;

use redis::{FromRedisValue, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

mod batch;
mod connect;
mod decode;
mod events;
mod library;

pub use library::bench_call;

use batch::{Arg, Op};
use decode::{corrupt, fail, job_body, job_id, parse, reserved, tube};
use library::{Kind, Library};

use super::{ConnId, Store, StoreEvent, Tick, TubeRef};
use crate::error::{StoreError, StoreResult};
use crate::job::{JobBody, JobStats, NewJob, PutOutcome, Reserved, StoreStats, TubeStats};
use crate::names::{JobId, Tube};

/// Most jobs one script call moves (a kick, a disconnect), so no call
/// blocks Redis for long.
const BATCH: u64 = 1000;
/// Most jobs one tick moves. Smaller than [`BATCH`]: ticks run while
/// workers wait for the jobs they move, and calls queued behind a tick wait
/// for all of it.
const TICK_BATCH: u64 = 250;
/// The timer's longest sleep: each tick renews this process's alive mark
/// (which expires after 3 s), and catches a due time another process created
/// but could not announce.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// A duration as the functions take it, in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The Redis storage engine.
pub struct RedisStore {
    /// The keys' hash tag, `{PREFIX}`.
    tag: String,
    /// Distinguishes this process's connections from other processes'.
    process: String,
    /// The operations waiting for the next call.
    queue: mpsc::UnboundedSender<Op>,
    events: Mutex<Option<mpsc::Receiver<StoreEvent>>>,
    /// Stops the event listener when the store is dropped.
    _listener: DropGuard,
}

impl RedisStore {
    /// Connects to the Redis at `url` and keeps its keys under `prefix`.
    ///
    /// Warns loudly if Redis may evict keys, since an evicted key is a lost job.
    pub async fn connect(url: &str, prefix: &str) -> StoreResult<RedisStore> {
        let client = redis::Client::open(url).map_err(fail)?;
        let tag = format!("{{{prefix}}}");
        let library = Library::new();
        let conn = connect::connect(&client, &tag, &library).await?;
        let (tx, rx) = mpsc::channel(1024);
        let stop = CancellationToken::new();
        tokio::spawn(events::listen(
            client,
            format!("{tag}events"),
            tx,
            stop.clone(),
        ));
        let process = format!(
            "{:016x}",
            std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id())
        );
        let (queue, ops) = mpsc::unbounded_channel();
        tokio::spawn(batch::run(conn, tag.clone(), process.clone(), library, ops));
        let store = RedisStore {
            tag,
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
        got.map(decode::job_stats).transpose()
    }

    async fn stats_tube(&self, t: &Tube) -> StoreResult<Option<TubeStats>> {
        let got: Option<Vec<u64>> = self.read("stats_tube", vec![Arg::Tube(t.clone())]).await?;
        got.map(|v| decode::tube_stats(t, v)).transpose()
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        decode::store_stats(self.read("stats", Vec::new()).await?)
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

    fn describe(&self) -> String {
        format!("Redis, keys under {}", self.tag)
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
