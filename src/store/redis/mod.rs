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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use redis::{FromRedisValue, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

mod batch;
mod conn;
mod connect;
mod decode;
mod events;
mod library;
mod refs;
mod shards;

pub use conn::Target;
pub use library::bench_call;
pub use shards::{SHARDS, shard_of_key, shard_tag, slot};

use batch::{Arg, Op, server_id_key, stopped};
use conn::Conn;
use decode::{corrupt, fail, job_body, job_id, parse, reserved, tube};
use library::{Kind, Library};
use refs::Refs;
use shards::Sharding;

use super::{ConnId, Store, StoreEvent, Tick, TubeList, TubeRef, TubeSettings};
use crate::error::{StoreError, StoreResult};
use crate::job::{
    ExportCursor, ExportPage, JobBody, JobState, JobStats, Lifecycle, NewJob, Put, PutOutcome,
    Released, Reserved, StoreStats, TubeStats, WholeJob,
};
use crate::names::{JobId, Tube};
use crate::schedule::MAX_SCHEDULES;

/// Most jobs one script call moves (a kick, a disconnect), so no call
/// blocks Redis for long.
const BATCH: u64 = 1000;
/// Most jobs one tick moves. Smaller than [`BATCH`]: ticks run while
/// workers wait for the jobs they move, and calls queued behind a tick wait
/// for all of it.
const TICK_BATCH: u64 = 250;
/// The timer's longest sleep: a tick at least this often renews this
/// process's alive mark (which expires after 3 s; see `HEARTBEAT`), and
/// catches a due time another process created but could not announce.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Keys a process takes from the cluster-wide sequence at a time.
const KEY_BLOCK: u64 = 256;

/// Tubes whose turns over their shards are kept apart (tubes whose names
/// hash alike share theirs, which only makes their turns less even).
const TURNS: usize = 1024;

/// This process's block of the cluster-wide key sequence, and the last
/// shard each tube (by the hash of its name) took.
struct Keys {
    next: u64,
    end: u64,
    turns: Vec<u8>,
}
/// How often the timer's tick renews this process's alive mark and forgets
/// the processes whose mark expired; on a cluster, how often the control
/// slot hears that this process lives (and says which others do, and which
/// tubes are paused).
const HEARTBEAT: Duration = Duration::from_millis(500);
/// How often a cluster's slot map is asked for, to choose the shards of new
/// jobs among the primaries (a slot moves rarely: a failover moves none).
const SLOT_MAP_EVERY: Duration = Duration::from_secs(10);
/// The longest a `reserve-with-timeout 0` waits to take in the other
/// processes' news before it answers with what it knows.
const CATCH_UP_LIMIT: Duration = Duration::from_millis(500);

/// A duration as the functions take it, in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// When a job was put, in ms since the epoch: `put_at` if known, else the
/// wall-clock time `age` ago, to the nearest (an export's times are whole
/// milliseconds).
fn put_at_ms(put_at: Option<std::time::SystemTime>, age: Duration) -> u64 {
    put_at
        .or_else(|| std::time::SystemTime::now().checked_sub(age))
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| {
            u64::try_from((d.as_micros() + 500) / 1000).unwrap_or(u64::MAX)
        })
}

/// How a Redis deployment is used beyond where it is.
#[derive(Debug, Clone)]
pub struct Options {
    /// Prefix of every key (it becomes the keys' hash tag).
    pub prefix: String,
    /// On a cluster, how many shards a tube's new jobs spread over; `None`:
    /// one per primary.
    pub spread: Option<usize>,
    /// On a cluster, tubes kept on one shard, for strict order.
    pub whole_tubes: Vec<String>,
    /// Replicas that must have a put before it is acknowledged, and how
    /// long to wait for them in ms (`--redis-wait`); `None`: Redis's own
    /// asynchronous replication.
    pub wait: Option<(u32, u64)>,
}

/// The Redis storage engine.
pub struct RedisStore {
    /// The control slot's hash tag, `{PREFIX}` (on one Redis, every key's).
    tag: String,
    /// Distinguishes this process's connections from other processes'.
    process: String,
    /// The operations waiting for the next call: one queue per shard and
    /// the control slot last (on one Redis, that one queue only).
    queues: Vec<mpsc::UnboundedSender<Op>>,
    /// On a cluster, the shards.
    sharding: Option<Arc<Sharding>>,
    /// When this process last renewed its alive mark (on a cluster, in the
    /// control slot).
    beat: Mutex<Option<Instant>>,
    /// The connection, for what is not a function call (the slot map).
    conn: Conn,
    /// When the cluster's slot map was last asked for.
    mapped: Mutex<Option<Instant>>,
    /// This process's block of the cluster-wide key sequence, and the
    /// tubes' turns over their shards.
    keys: tokio::sync::Mutex<Keys>,
    /// On a cluster, held while the shards are asked what they hold
    /// ([`RedisStore::rescan`]), and whether they are being asked.
    rescanning: tokio::sync::Mutex<()>,
    scanning: AtomicBool,
    /// Whether a reserve since the timer last asked ([`Store::held_back`])
    /// took less than it wanted because a tube's rate was used up.
    held_back: AtomicBool,
    /// Changes of the tubes' use and watch counts, gathered.
    refs: Refs,
    events: Mutex<Option<mpsc::Receiver<StoreEvent>>>,
    /// On a cluster, asks the announcements' listener to take in what the
    /// shards said up to now, and answers once it has
    /// ([`events::listen_shards`]).
    catch_up: Option<events::CatchUps>,
    /// Stops the event listener when the store is dropped.
    _listener: DropGuard,
}

/// A look at what the shards hold ([`RedisStore::rescan`]) under way.
struct Scan<'a> {
    scanning: &'a AtomicBool,
    rescan: &'a AtomicU64,
    /// The shards asked, and those that did not answer.
    asked: u64,
    failed: u64,
    done: bool,
}

impl Drop for Scan<'_> {
    fn drop(&mut self) {
        // Cut off: every shard asked is asked again by the next reserve;
        // else those that failed.
        let again = if self.done { self.failed } else { self.asked };
        self.rescan.fetch_or(again, Ordering::AcqRel);
        self.scanning.store(false, Ordering::Release);
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` and keeps its keys under `prefix`.
    ///
    /// Warns loudly if Redis may evict keys, since an evicted key is a lost job.
    pub async fn connect(url: &str, prefix: &str) -> StoreResult<RedisStore> {
        let options = Options {
            prefix: prefix.to_string(),
            spread: Some(SHARDS),
            whole_tubes: Vec::new(),
            wait: None,
        };
        RedisStore::open(Target::Single(url.to_string()), options).await
    }

    /// Connects to the deployment `target` names.
    pub async fn open(target: Target, options: Options) -> StoreResult<RedisStore> {
        let tag = format!("{{{}}}", options.prefix);
        let library = Arc::new(Library::new());
        let (tx, rx) = mpsc::channel(1024);
        let stop = CancellationToken::new();
        let process = format!(
            "{:016x}",
            std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id())
        );
        let mut catching_up = None;
        // On a cluster, told once the shards' news channels are heard.
        let mut subscribing = None;
        // The cluster's nodes as far as known, shared by its connections.
        let mut cluster_nodes = None;
        let (conn, sharding) = match &target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str()).map_err(fail)?;
                let conn = connect::single(&client).await?;
                tokio::spawn(events::listen(
                    events::Source::Client(Box::new(client)),
                    format!("{tag}events"),
                    tx,
                    stop.clone(),
                ));
                (conn, None)
            }
            Target::Sentinel { sentinels, master } => {
                let followed = conn::Followed::new(sentinels, master).map_err(fail)?;
                tokio::spawn(events::listen(
                    events::Source::Sentinel(followed.clone()),
                    format!("{tag}events"),
                    tx,
                    stop.clone(),
                ));
                (Conn::Sentinel(followed), None)
            }
            Target::Cluster(seeds) => {
                let nodes = Arc::new(connect::Nodes::new(seeds).map_err(fail)?);
                cluster_nodes = Some(Arc::clone(&nodes));
                let conn = connect::cluster(&nodes).await?;
                let sharding = Arc::new(Sharding::new(
                    &options.prefix,
                    options.spread,
                    options.whole_tubes.clone(),
                ));
                let (catch_up, catch_ups) = mpsc::unbounded_channel();
                let (heard, hearing) = oneshot::channel();
                tokio::spawn(events::listen_shards(
                    nodes,
                    sharding.clone(),
                    tx,
                    catch_ups,
                    heard,
                    stop.clone(),
                ));
                subscribing = Some(hearing);
                catching_up = Some(catch_up);
                (conn, Some(sharding))
            }
        };
        // With --redis-wait, the calls that put go on a connection of their
        // own: WAIT holds its connection up inside Redis until the replicas
        // answer (for its whole timeout when they do not), and every other
        // call on that connection would wait behind it.
        let waiting = match (options.wait, &target) {
            (None, _) => None,
            (Some(_), Target::Single(url)) => {
                Some(connect::single(&redis::Client::open(url.as_str()).map_err(fail)?).await?)
            }
            (Some(_), Target::Sentinel { sentinels, master }) => Some(Conn::Sentinel(
                conn::Followed::new(sentinels, master).map_err(fail)?,
            )),
            (Some(_), Target::Cluster(_)) => {
                let nodes = cluster_nodes.as_ref().expect("made above, for a cluster");
                Some(connect::cluster(nodes).await?)
            }
        };
        let mut conn = conn;
        connect::prepare(&mut conn, &tag, &library).await?;
        let tags = match &sharding {
            Some(s) => s.tags.clone(),
            None => vec![tag.clone()],
        };
        let queues: Vec<_> = tags
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let (queue, ops) = mpsc::unbounded_channel();
                tokio::spawn(batch::run(
                    conn.clone(),
                    waiting.clone(),
                    t,
                    process.clone(),
                    library.clone(),
                    sharding.clone().map(|s| (s, i)),
                    options.wait,
                    ops,
                ));
                queue
            })
            .collect();
        let refs = Refs::new(queues[queues.len() - 1].clone(), process.clone());
        let store = RedisStore {
            tag,
            process,
            queues,
            sharding,
            beat: Mutex::new(None),
            conn: conn.clone(),
            mapped: Mutex::new(None),
            keys: tokio::sync::Mutex::new(Keys {
                next: 0,
                end: 0,
                turns: vec![0; TURNS],
            }),
            rescanning: tokio::sync::Mutex::new(()),
            scanning: AtomicBool::new(false),
            held_back: AtomicBool::new(false),
            refs,
            events: Mutex::new(Some(rx)),
            catch_up: catching_up,
            _listener: stop.drop_guard(),
        };
        if let Some(hearing) = subscribing {
            // Until the news channels are subscribed, a catch-up (which a
            // `reserve-with-timeout 0` asks for before it answers that
            // nothing is ready) waits for them, and then for its own time
            // limit; a first command should not. Bounded, so that a node
            // that does not answer does not hold the start back for long:
            // the listener goes on trying by itself.
            let _ = tokio::time::timeout(conn::CALL_TIMEOUT, hearing).await;
        }
        // Counted among the live processes before any connection attaches
        // to a tube.
        store.tick().await?;
        if let Some(s) = &store.sharding {
            // What every shard holds, asked now (after the subscriptions,
            // which mark every shard's news as possibly missed) rather than
            // by the first reserve.
            store.rescan(s).await?;
        }
        Ok(store)
    }

    /// The control slot's queue (on one Redis, the only one).
    fn control(&self) -> usize {
        self.queues.len() - 1
    }

    /// Runs the operation `name` with `args` in the next call to `shard`.
    async fn op_on(
        &self,
        shard: usize,
        kind: Kind,
        name: &'static str,
        args: Vec<Arg>,
    ) -> StoreResult<Value> {
        let (reply, result) = oneshot::channel();
        self.queues[shard]
            .send(Op {
                kind,
                name,
                args,
                reply,
                unheard: false,
            })
            .map_err(|_| stopped())?;
        result.await.map_err(|_| stopped())?
    }

    /// Runs the operation in the control slot (on one Redis, the only one).
    async fn op(&self, kind: Kind, name: &'static str, args: Vec<Arg>) -> StoreResult<Value> {
        self.op_on(self.control(), kind, name, args).await
    }

    /// A move of existing jobs (or any write that is not a put).
    async fn write<T: FromRedisValue>(&self, name: &'static str, args: Vec<Arg>) -> StoreResult<T> {
        parse(self.op(Kind::Moves, name, args).await?)
    }

    /// The shard of the job `id` (on one Redis, the only queue).
    fn locate(&self, id: &JobId) -> usize {
        self.sharding.as_ref().map_or(0, |s| s.locate(id))
    }

    /// A move of the job `id`, in its shard: the operation's arguments are
    /// `before`, the job's id, then `after`.
    async fn move_job<T: FromRedisValue>(
        &self,
        name: &'static str,
        before: Vec<Arg>,
        id: &JobId,
        after: Vec<Arg>,
    ) -> StoreResult<(usize, T)> {
        let shard = self.locate(id);
        let mut args = before;
        args.push(Arg::Id(id.clone()));
        args.extend(after);
        let got = self.op_on(shard, Kind::Moves, name, args).await?;
        Ok((shard, parse(got)?))
    }

    /// Every shard's answer to a read (the control slot's too, last, with
    /// `control`); on one Redis, the one answer.
    async fn every<T: FromRedisValue>(
        &self,
        name: &'static str,
        args: impl Fn() -> Vec<Arg>,
        control: bool,
    ) -> StoreResult<Vec<T>> {
        let upto = if control || self.sharding.is_none() {
            self.queues.len()
        } else {
            self.queues.len() - 1
        };
        let got = join_all((0..upto).map(|q| self.op_on(q, Kind::Reads, name, args()))).await;
        got.into_iter().map(|v| parse(v?)).collect()
    }

    /// A reserved job that came from `shard`, by a call sent at `sent`:
    /// its TTR's end is due there.
    fn reserved_from(
        &self,
        shard: usize,
        sent: Instant,
        got: Option<Reserved>,
    ) -> Option<Reserved> {
        let got = got?;
        if let Some(s) = &self.sharding {
            s.due_at(shard, sent + got.ttr);
        }
        Some(got)
    }

    /// `shard` got something due `delay` after it ran a call sent at
    /// `sent` (ready jobs are told by the call's own reply).
    ///
    /// Counted from when the call was sent, not from when its reply came:
    /// Redis counted the delay from a moment in between, so the estimate is
    /// never later than the due time (a tick a little early finds nothing
    /// and says how long is left). Counted from the reply, it was late by
    /// the reply's way back, and under load a reserve timing out just
    /// after a job fell due did not tick that shard, and missed the job.
    fn due_in(&self, shard: usize, sent: Instant, delay: Duration) {
        if let Some(s) = &self.sharding
            && !delay.is_zero()
        {
            s.due_at(shard, sent + delay);
        }
    }

    /// After the shards' news may have been missed: learns again which
    /// shards have ready jobs of which tubes.
    ///
    /// Reserves that come meanwhile wait for it, and go on in the order
    /// they came (the lock is fair). One that went on at once would choose
    /// among the shards from what was known before, and could take the job
    /// that an earlier reserve, for a connection waiting longer, was to
    /// have.
    ///
    /// Only the shards whose news may have been missed are asked. One that
    /// does not answer (its primary frozen or failing over) is asked again
    /// by the next reserve, and meanwhile the others' jobs are served: a
    /// reserve waited on the whole look, which failed while any primary
    /// was away, so a frozen primary held up every tube's reserves. The
    /// error is handed back for the reserve to give, should it find
    /// nothing (the shard may hold its job); all failing is an error.
    async fn rescan(&self, s: &Sharding) -> StoreResult<Option<StoreError>> {
        if s.rescan.load(Ordering::Acquire) == 0 && !self.scanning.load(Ordering::Acquire) {
            return Ok(None);
        }
        let _one = self.rescanning.lock().await;
        let asked = s.rescan.swap(0, Ordering::AcqRel);
        if asked == 0 {
            return Ok(None);
        }
        // While it runs, `scanning` tells reserves to wait; should it be
        // cut off (its command dropped), the next reserve asks again.
        let mut scan = Scan {
            scanning: &self.scanning,
            rescan: &s.rescan,
            asked,
            failed: 0,
            done: false,
        };
        self.scanning.store(true, Ordering::Release);
        let shards: Vec<usize> = (0..shards::SHARDS)
            .filter(|q| asked & (1 << q) != 0)
            .collect();
        let got = join_all(
            shards
                .iter()
                .map(|&q| self.op_on(q, Kind::Reads, "inventory", Vec::new())),
        )
        .await;
        // The first ready jobs come back with each call (its heads).
        let mut error = None;
        for (&q, got) in shards.iter().zip(got) {
            if let Err(e) = got {
                scan.failed |= 1 << q;
                error.get_or_insert(e);
            }
        }
        scan.done = true;
        match error {
            Some(e) if scan.failed == asked => Err(e),
            unknown => Ok(unknown),
        }
    }

    /// A reserve on a cluster: in the shard whose first ready job is the
    /// best of all the shards' (as far as this process knows), one call, so
    /// a reserve never wins two jobs. A shard that turns out to have none
    /// says so in its reply, and the next best is tried.
    async fn reserve_sharded(
        &self,
        s: &Sharding,
        conn: ConnId,
        tubes: &[Tube],
        max: usize,
    ) -> StoreResult<Vec<Reserved>> {
        let unknown = self.rescan(s).await?;
        // Shards (per tube) that had nothing, or failed: not asked again.
        let mut tried: Vec<(usize, Tube)> = Vec::new();
        let (mut failed, mut answered) = (None, false);
        let mut out = Vec::new();
        loop {
            let heads: Vec<(u64, usize, Tube)> = s
                .candidates(tubes)
                .into_iter()
                .filter(|(_, _, shard, t)| !tried.iter().any(|(s, u)| s == shard && u == t))
                .map(|(pri, _, shard, t)| (pri, shard, t))
                .collect();
            let untried: Vec<(usize, Tube)> = heads
                .iter()
                .map(|(_, shard, t)| (*shard, t.clone()))
                .collect();
            // Concurrent reserves each take the best first job no other is
            // after, rather than all racing for the one best (which only
            // one can win): together they still take the oldest jobs.
            let claim = s.claim(&untried);
            let Some((shard, t)) = claim.as_ref().map(|c| c.target().clone()) else {
                // Every shard tried failed, or a shard that may hold a job
                // could not be looked at: say so rather than "none".
                return match (failed, unknown) {
                    (Some(e), _) if !answered && out.is_empty() => Err(e),
                    (_, Some(e)) if out.is_empty() => Err(e),
                    _ => Ok(out),
                };
            };
            // A batch takes from this shard only jobs as urgent as the best
            // another shard has, so that it keeps to priority order across
            // shards; the shard is asked again once the others' turn is over
            // (its news says what it has left). Within one priority, a shard's
            // jobs come together, oldest first.
            let upto = heads
                .iter()
                .filter(|(_, k, u)| !(*k == shard && *u == t))
                .map(|(pri, _, _)| *pri)
                .min();
            let names = Arg::Tube(t.clone());
            let sent = Instant::now();
            match self
                .reserve_in(shard, conn, names, max - out.len(), upto, tubes)
                .await
            {
                Ok(got) if got.is_empty() => {
                    answered = true;
                    tried.push((shard, t));
                }
                Ok(got) => {
                    out.extend(
                        got.into_iter()
                            .filter_map(|r| self.reserved_from(shard, sent, Some(r))),
                    );
                    if out.len() >= max {
                        return Ok(out);
                    }
                    if upto.is_none() {
                        // No other shard had a job: this one gave what it had.
                        tried.push((shard, t));
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    tried.push((shard, t));
                }
            }
        }
    }

    /// Reserves up to `max` jobs of `names` (tubes, separated by spaces) in
    /// one call to `shard`, with `upto`, of one tube only those of that
    /// priority or more urgent; `tubes` are names already known.
    async fn reserve_in(
        &self,
        shard: usize,
        conn: ConnId,
        names: Arg,
        max: usize,
        upto: Option<u64>,
        tubes: &[Tube],
    ) -> StoreResult<Vec<Reserved>> {
        // A tube's rate held the reserve back: the library says so by a 0
        // in place of a job (or after the jobs of a batch).
        let held = |v: &Value| {
            let held = matches!(v, Value::Int(0));
            if held {
                self.held_back.store(true, Ordering::Relaxed);
            }
            held
        };
        if max == 1 {
            // The common case has an operation of its own, which spares the
            // list around its one job.
            let args = vec![Arg::Owner(conn), names];
            let got = self.op_on(shard, Kind::Moves, "reserve", args).await?;
            if held(&got) {
                return Ok(Vec::new());
            }
            return Ok(reserved(got, tubes)?.into_iter().collect());
        }
        let upto = upto.map_or(Arg::Static(""), Arg::Int);
        let args = vec![Arg::Owner(conn), names, Arg::Int(max as u64), upto];
        let got = self.op_on(shard, Kind::Moves, "reserve_many", args).await?;
        let got: Vec<Value> = parse(got)?;
        got.into_iter()
            .filter(|v| !held(v))
            .map(|v| reserved(v, tubes)?.ok_or_else(|| corrupt("reserve_many")))
            .collect()
    }

    /// `ids` grouped by shard, each group in chunks of at most `BATCH`,
    /// each chunk as the library takes a list of ids (separated by spaces).
    fn ids_by_shard(&self, ids: &[JobId]) -> Vec<(usize, String)> {
        let mut by_shard: Vec<Vec<&JobId>> = vec![Vec::new(); self.queues.len()];
        for id in ids {
            by_shard[self.locate(id)].push(id);
        }
        let mut out = Vec::new();
        for (shard, ids) in by_shard.iter().enumerate() {
            for chunk in ids.chunks(BATCH as usize) {
                let mut list = String::new();
                for id in chunk {
                    if !list.is_empty() {
                        list.push(' ');
                    }
                    match id {
                        JobId::Server(n) => server_id_key(&mut list, *n),
                        JobId::Client(name) => list.push_str(name),
                    }
                }
                out.push((shard, list));
            }
        }
        out
    }

    /// On a cluster: forgets the tubes `names` (separated by spaces), found
    /// gone from every shard: the control slot forgets when each was first
    /// seen, and the shards the counts they kept.
    async fn forget_gone(&self, names: String) -> StoreResult<()> {
        self.write::<i64>("forget_births", vec![Arg::Text(names.clone())])
            .await?;
        let forgot = join_all((0..SHARDS).map(|shard| {
            let args = vec![Arg::Text(names.clone())];
            self.op_on(shard, Kind::Moves, "forget_counts", args)
        }))
        .await;
        for got in forgot {
            got?;
        }
        Ok(())
    }

    /// After a heartbeat: sends this process's use and watch counts again
    /// if Redis no longer has them (it lost its data, or another process
    /// took this one for dead and forgot them) or may have them wrong (a
    /// change failed, and may or may not have been made).
    fn keep_refs(&self, lost: bool) {
        if self.refs.take_dirty() | lost {
            self.refs.restore();
        }
    }

    /// The tick of a cluster: the control slot's heartbeat (at most every
    /// [`HEARTBEAT`]), then the shards this process ticks that are due.
    async fn tick_sharded(&self, s: &Sharding) -> StoreResult<Tick> {
        let now = Instant::now();
        let mut ready = Vec::new();
        // While a pause is known, every tick asks: the tube may have gone
        // (its pause with it), or been resumed by another process.
        let beat_due = s.pausing()
            || self
                .beat
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none_or(|last| now.duration_since(last) >= HEARTBEAT);
        if beat_due {
            let (tick, live, pauses) = tokio::join!(
                self.op(
                    Kind::Moves,
                    "tick",
                    vec![Arg::Int(TICK_BATCH), Arg::Text(self.process.clone())]
                ),
                self.op(Kind::Reads, "live", Vec::new()),
                self.op(Kind::Reads, "pauses", Vec::new()),
            );
            let (_, lost, tubes) = ticked(tick?)?;
            ready.extend(tubes);
            self.keep_refs(lost);
            s.set_live(&self.process, parse(live?)?);
            let pauses: Vec<Value> = parse(pauses?)?;
            // Counted from the reply, not from `now`: Redis read its clock
            // somewhere in the round trip, and a pause counted from before
            // it would end early here, its jobs handed out while
            // `stats-tube` still says the tube is paused. (The time left is
            // from Redis's millisecond rounded down, so it is never short.)
            let replied = Instant::now();
            let mut known = Vec::new();
            for pair in pauses.chunks(2) {
                if let [t, left] = pair {
                    let left: u64 = parse(left.clone())?;
                    known.push((
                        tube(&parse::<String>(t.clone())?)?,
                        replied + Duration::from_millis(left),
                    ));
                }
            }
            ready.extend(s.set_pauses(known));
            *self.beat.lock().unwrap_or_else(PoisonError::into_inner) = Some(now);
            self.learn_slot_map(s, now).await;
        }
        let (due, mut next) = s.to_tick(&self.process, now);
        let sent = Instant::now();
        let got = join_all(due.iter().map(|&(shard, _)| {
            self.op_on(
                shard,
                Kind::Moves,
                "tick",
                vec![Arg::Int(TICK_BATCH), Arg::Static("")],
            )
        }))
        .await;
        let mut failed = None;
        for (&(shard, news), got) in due.iter().zip(got) {
            match got.and_then(ticked) {
                Ok((after, _, tubes)) => {
                    // From when the tick was sent, as in `due_in`.
                    let at = after.map(|d| sent + d);
                    s.ticked(shard, news, at);
                    if let Some(at) = at {
                        next = Some(next.map_or(at, |n| n.min(at)));
                    }
                    for t in tubes {
                        if !ready.contains(&t) {
                            ready.push(t);
                        }
                    }
                }
                Err(e) => failed = Some(e),
            }
        }
        let (ended, pause_next) = s.pauses_ended(Instant::now());
        ready.extend(ended);
        if let Some(at) = pause_next {
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(Tick {
            ready,
            next: next.map(|at| at.saturating_duration_since(Instant::now())),
        })
    }
}

/// A tick's reply: the time until the next due time, whether the process's
/// use and watch counts are gone from Redis, and the tubes that got ready
/// jobs.
fn ticked(v: Value) -> StoreResult<(Option<Duration>, bool, Vec<Tube>)> {
    let v: Vec<Value> = parse(v)?;
    let mut v = v.into_iter();
    let next: i64 = parse(v.next().ok_or_else(|| corrupt("tick"))?)?;
    let lost: i64 = parse(v.next().ok_or_else(|| corrupt("tick"))?)?;
    let ready = v
        .map(|t| parse::<String>(t).and_then(|t| tube(&t)))
        .collect::<StoreResult<_>>()?;
    Ok((
        u64::try_from(next).ok().map(Duration::from_micros),
        lost == 1,
        ready,
    ))
}

impl Store for RedisStore {
    async fn put(&self, job: NewJob) -> StoreResult<Put> {
        let name = job.id.clone();
        let (delay, ttl) = (job.delay, job.life.ttl);
        // On a cluster every job's key comes from this process's block of
        // the cluster-wide sequence, so keys of all shards follow the order
        // of the puts; a server id's key decides its shard. (A put that
        // finds its client id taken has used a number all the same.)
        let (shard, id_arg) = match (&self.sharding, &job.id) {
            (Some(s), None) => {
                let key = self.next_key(s, Some(&job.tube)).await?;
                let id = JobId::Server(key);
                (s.locate(&id), Arg::Id(id))
            }
            (Some(s), Some(name)) => {
                let key = self.next_key(s, None).await?;
                let shard = s.locate(&JobId::Client(name.clone()));
                (shard, Arg::Text(format!("{key:012x}#{name}")))
            }
            (None, Some(name)) => (0, Arg::Text(name.to_string())),
            (None, None) => (0, Arg::Static("")),
        };
        let args = vec![
            Arg::Tube(job.tube),
            id_arg,
            Arg::Int(job.pri.into()),
            Arg::Int(millis(job.delay)),
            Arg::Int(millis(job.ttr)),
            Arg::Body(job.body),
            Arg::Text(decode::encode_options(&job.life)),
        ];
        let sent = Instant::now();
        let got = match self.op_on(shard, Kind::Puts, "put", args).await {
            Err(StoreError::Unavailable(why)) if why.contains("is taken") => {
                // The cluster-wide key sequence went back (a failover of
                // the control slot's primary lost its last steps): this
                // block's keys may all be taken; the next put takes a new
                // block. This one fails, and its producer tries again.
                let mut keys = self.keys.lock().await;
                (keys.next, keys.end) = (0, 0);
                return Err(StoreError::Unavailable(why));
            }
            got => got?,
        };
        let outcome = match (got, name) {
            (Value::Int(0), Some(name)) => {
                return Ok(Put {
                    outcome: PutOutcome::Exists(JobId::Client(name)),
                    expires: None,
                });
            }
            (Value::BulkString(_), Some(name)) => PutOutcome::Inserted(JobId::Client(name)),
            (got @ Value::Int(_), None) => PutOutcome::Inserted(job_id(got)?),
            _ => return Err(corrupt("put")),
        };
        self.due_in(shard, sent, delay);
        if let Some(ttl) = ttl {
            self.due_in(shard, sent, ttl);
        }
        // A time to live from the tube's settings is left to the timer,
        // which looks at Redis at least every MAX_SLEEP (and on a cluster
        // the shard says so itself).
        Ok(Put {
            outcome,
            expires: None,
        })
    }

    async fn reserve(&self, conn: ConnId, tubes: &[Tube]) -> StoreResult<Option<Reserved>> {
        Ok(self.reserve_batch(conn, tubes, 1).await?.pop())
    }

    async fn reserve_batch(
        &self,
        conn: ConnId,
        tubes: &[Tube],
        max: usize,
    ) -> StoreResult<Vec<Reserved>> {
        if let Some(s) = &self.sharding {
            return self.reserve_sharded(s, conn, tubes, max).await;
        }
        let names = match tubes {
            [one] => Arg::Tube(one.clone()),
            _ => Arg::Text(tubes.iter().map(Tube::as_str).collect::<Vec<_>>().join(" ")),
        };
        self.reserve_in(self.control(), conn, names, max, None, tubes)
            .await
    }

    async fn remove_batch(&self, conn: ConnId, ids: &[JobId], finish: bool) -> StoreResult<u64> {
        let mode = if finish { "finish" } else { "delete" };
        let calls = self.ids_by_shard(ids).into_iter().map(|(shard, list)| {
            let args = vec![Arg::Owner(conn), Arg::Text(list), Arg::Static(mode)];
            self.op_on(shard, Kind::Moves, "delete_many", args)
        });
        let mut removed = 0;
        for got in join_all(calls).await {
            removed += parse::<u64>(got?)?;
        }
        Ok(removed)
    }

    async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        let shard = self.locate(id);
        let args = vec![Arg::Owner(conn), Arg::Id(id.clone())];
        let sent = Instant::now();
        let got = self.op_on(shard, Kind::Moves, "reserve_job", args).await?;
        Ok(self.reserved_from(shard, sent, reserved(got, &[])?))
    }

    async fn give_back(&self, conn: ConnId, id: &JobId) -> StoreResult<()> {
        let (_, _): (usize, Option<String>) = self
            .move_job("give_back", vec![Arg::Owner(conn)], id, Vec::new())
            .await?;
        Ok(())
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
    ) -> StoreResult<Option<Released>> {
        let after = vec![Arg::Int(pri.into()), Arg::Int(millis(delay))];
        let sent = Instant::now();
        let (shard, got): (usize, Option<(String, i64)>) = self
            .move_job("release", vec![Arg::Owner(conn)], id, after)
            .await?;
        let Some((t, delay)) = got else {
            return Ok(None);
        };
        // A negative delay: buried, having used up its tries.
        let released = Released {
            tube: tube(&t)?,
            buried: delay < 0,
            delay: Duration::from_millis(delay.max(0) as u64),
        };
        self.due_in(shard, sent, released.delay);
        Ok(Some(released))
    }

    async fn bury(&self, conn: ConnId, id: &JobId, pri: u32) -> StoreResult<bool> {
        let after = vec![Arg::Int(pri.into())];
        let (_, n): (usize, i64) = self
            .move_job("bury", vec![Arg::Owner(conn)], id, after)
            .await?;
        Ok(n == 1)
    }

    async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        let sent = Instant::now();
        let (shard, ttr): (usize, Option<u64>) = self
            .move_job("touch", vec![Arg::Owner(conn)], id, Vec::new())
            .await?;
        let ttr = ttr.map(Duration::from_millis);
        if let (Some(s), Some(ttr)) = (&self.sharding, ttr) {
            s.due_at(shard, sent + ttr);
        }
        Ok(ttr)
    }

    async fn kick(&self, t: &Tube, bound: u64) -> StoreResult<u64> {
        if self.sharding.is_none() {
            return self.kick_in(0, t, bound, "").await.map(|(n, _)| n);
        }
        // Buried jobs if any shard has one, else delayed ones: in rounds,
        // the first jobs of all shards merged in the order kick takes them,
        // then each shard kicks its share of those.
        let mut kicked = 0;
        for kind in ["buried", "delayed"] {
            while kicked < bound {
                let share = self.firsts(t, kind, (bound - kicked).min(BATCH)).await?;
                if share.iter().all(|&n| n == 0) {
                    break;
                }
                let got = join_all(
                    share
                        .iter()
                        .enumerate()
                        .filter(|(_, n)| **n > 0)
                        .map(|(shard, &n)| self.kick_in(shard, t, n, kind)),
                )
                .await;
                let mut round = 0;
                for got in got {
                    round += got?.0;
                }
                if round == 0 {
                    break;
                }
                kicked += round;
            }
            if kicked > 0 {
                break;
            }
        }
        Ok(kicked)
    }

    async fn kick_job(&self, id: &JobId) -> StoreResult<Option<Tube>> {
        let (_, t): (usize, Option<String>) = self
            .move_job("kick_job", Vec::new(), id, Vec::new())
            .await?;
        t.as_deref().map(tube).transpose()
    }

    async fn peek(&self, id: &JobId) -> StoreResult<Option<JobBody>> {
        let shard = self.locate(id);
        self.peek_in(shard, "id", Arg::Id(id.clone()), &[]).await
    }

    async fn peek_ready(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_tube("ready", t).await
    }

    async fn peek_delayed(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_tube("delayed", t).await
    }

    async fn peek_buried(&self, t: &Tube) -> StoreResult<Option<JobBody>> {
        self.peek_tube("buried", t).await
    }

    async fn export(&self, from: ExportCursor, max: usize) -> StoreResult<ExportPage> {
        // One page is one HSCAN of one shard's job hash.
        let parts = if self.sharding.is_some() { SHARDS } else { 1 };
        let part = usize::try_from(from.part).unwrap_or(usize::MAX);
        if part >= parts {
            return Ok(ExportPage::default());
        }
        let args = vec![Arg::Int(from.at), Arg::Int(max.max(1) as u64)];
        let got: (u64, Vec<Value>) = parse(self.op_on(part, Kind::Reads, "export", args).await?)?;
        let jobs = got
            .1
            .into_iter()
            .map(decode::whole_job)
            .collect::<StoreResult<Vec<_>>>()?;
        let next = match got.0 {
            0 if part + 1 < parts => Some(ExportCursor {
                part: part as u64 + 1,
                at: 0,
            }),
            0 => None,
            at => Some(ExportCursor {
                part: part as u64,
                at,
            }),
        };
        Ok(ExportPage { jobs, next })
    }

    async fn import(&self, job: WholeJob) -> StoreResult<PutOutcome> {
        let hex = |key: u64| format!("{key:012x}");
        let (shard, key, mode) = match (&self.sharding, &job.id) {
            (None, JobId::Client(_)) => (0, String::new(), "keep"),
            (None, &JobId::Server(key)) => (0, hex(key), "keep"),
            (Some(s), JobId::Client(_)) => {
                let key = self.next_key(s, None).await?;
                (s.locate(&job.id), hex(key), "keep")
            }
            (Some(s), &JobId::Server(key)) => {
                // The key's shard holds the job if it was imported before;
                // a key the cluster never handed out is claimed first, so
                // no process hands it out after.
                let claimed: i64 = self.write("claim_key", vec![Arg::Int(key)]).await?;
                let shard = s.locate(&job.id);
                let mode = if claimed == 1 { "keep" } else { "same" };
                let sent = Instant::now();
                let got = self.import_on(shard, &job, hex(key), mode).await?;
                if got != Value::Int(-1) {
                    return self.imported(shard, sent, &job, got);
                }
                let key = self.next_key(s, Some(&job.tube)).await?;
                (s.locate(&JobId::Server(key)), hex(key), "keep")
            }
        };
        let sent = Instant::now();
        let got = self.import_on(shard, &job, key, mode).await?;
        self.imported(shard, sent, &job, got)
    }

    async fn stats_job(&self, id: &JobId) -> StoreResult<Option<JobStats>> {
        let shard = self.locate(id);
        let got = self
            .op_on(shard, Kind::Reads, "stats_job", vec![Arg::Id(id.clone())])
            .await?;
        let got: Option<Vec<Value>> = parse(got)?;
        got.map(decode::job_stats).transpose()
    }

    async fn stats_tube(&self, t: &Tube) -> StoreResult<Option<TubeStats>> {
        // On a cluster: the shards' counts summed; the users and the pause
        // are the control slot's (the last answer).
        let all: Vec<Option<Vec<u64>>> = self
            .every("stats_tube", || vec![Arg::Tube(t.clone())], true)
            .await?;
        let mut sum: Option<Vec<u64>> = None;
        let mut exists = self.sharding.is_none();
        for mut v in all.into_iter().flatten() {
            if self.sharding.is_some() {
                exists |= v.pop() == Some(1);
            }
            match &mut sum {
                None => sum = Some(v),
                Some(sum) => {
                    for (i, (a, b)) in sum.iter_mut().zip(v).enumerate() {
                        // The pause and its time left are the control
                        // slot's; the rest are sums.
                        *a = if i == 10 || i == 11 {
                            (*a).max(b)
                        } else {
                            *a + b
                        };
                    }
                }
            }
        }
        match sum {
            Some(v) if exists => decode::tube_stats(t, v).map(Some),
            Some(_) => {
                // Only counts kept in case it lived on elsewhere: it does
                // not, so a tube made anew counts from zero.
                self.forget_gone(t.as_str().to_string()).await?;
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        let all: Vec<Vec<u64>> = self.every("stats", Vec::new, true).await?;
        let mut sum = vec![0u64; 9];
        for v in all {
            for (a, b) in sum.iter_mut().zip(v) {
                *a += b;
            }
        }
        if self.sharding.is_some() {
            sum[7] = self.list_tubes().await?.len() as u64;
        }
        decode::store_stats(sum)
    }

    async fn list_tubes(&self) -> StoreResult<TubeList> {
        if self.sharding.is_none() {
            let names: Vec<String> = parse(self.op(Kind::Reads, "list_tubes", Vec::new()).await?)?;
            return names.iter().map(|n| tube(n)).collect::<StoreResult<_>>();
        }
        // Each shard's list, and the control slot's, with when each tube
        // was first seen there: merged by the earliest. A tube the control
        // slot only remembers, and no shard holds, is gone: the control
        // slot is told to forget it.
        let all: Vec<Vec<Value>> = self.every("list_tubes", Vec::new, true).await?;
        let mut first: Vec<(f64, Tube, bool)> = Vec::new();
        // Where each tube is in `first`: a search of the list for every
        // entry would make the merge quadratic in the number of tubes.
        let mut at: std::collections::HashMap<Tube, usize> = std::collections::HashMap::new();
        for v in all {
            for entry in v.chunks(3) {
                if let [name, score, live] = entry {
                    let t = tube(&parse::<String>(name.clone())?)?;
                    let score: f64 = parse(score.clone())?;
                    let live = parse::<i64>(live.clone())? == 1;
                    match at.get(&t) {
                        Some(&i) => {
                            let known = &mut first[i];
                            known.0 = known.0.min(score);
                            known.2 |= live;
                        }
                        None => {
                            at.insert(t.clone(), first.len());
                            first.push((score, t, live));
                        }
                    }
                }
            }
        }
        let gone: Vec<&str> = first
            .iter()
            .filter(|(_, _, live)| !live)
            .map(|(_, t, _)| t.as_str())
            .collect();
        if !gone.is_empty() {
            self.forget_gone(gone.join(" ")).await?;
        }
        first.retain(|(_, _, live)| *live);
        first.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(first.into_iter().map(|(_, t, _)| t).collect())
    }

    async fn pause_tube(&self, t: &Tube, delay: Duration) -> StoreResult<bool> {
        let Some(s) = &self.sharding else {
            let args = vec![
                Arg::Tube(t.clone()),
                Arg::Int(millis(delay)),
                Arg::Static(""),
            ];
            let until: Option<u64> = self.write("pause_tube", args).await?;
            return Ok(until.is_some());
        };
        // Pauses are kept in the control slot; a tube may exist there only
        // by its jobs in the shards.
        let exists = self.list_tubes().await?.contains(t);
        if !exists {
            return Ok(false);
        }
        let args = vec![
            Arg::Tube(t.clone()),
            Arg::Int(millis(delay)),
            Arg::Static("1"),
        ];
        let Some(until) = self.write::<Option<u64>>("pause_tube", args).await? else {
            return Ok(false);
        };
        // Redis counts the pause from its clock rounded up to the
        // millisecond, up to one after the instant it read; that
        // millisecond keeps the end here from coming before Redis's.
        s.pause(
            t,
            (!delay.is_zero()).then(|| Instant::now() + delay + Duration::from_millis(1)),
        );
        // Every shard holds the pause too before it is answered: the other
        // processes reserve from the shards, and learn of this pause only
        // at their next tick. A shard that cannot be told fails the
        // command; the pause is then kept where it was told (a retry
        // tells the rest).
        let held = join_all((0..self.queues.len() - 1).map(|shard| {
            let args = vec![Arg::Tube(t.clone()), Arg::Int(until)];
            self.op_on(shard, Kind::Moves, "hold_tube", args)
        }))
        .await;
        for got in held {
            got?;
        }
        Ok(true)
    }

    async fn set_tube(&self, t: &Tube, options: Lifecycle) -> StoreResult<()> {
        // Every shard keeps the settings, for the puts it takes (and the
        // control slot, which `tube_settings` reads).
        // On a cluster each shard of the tube allows its share of the rate
        // (rounded up: a shard allows at least one reserve a second).
        let shards = self.sharding.as_ref().map_or(1, |s| s.spread_of(t)) as u32;
        let share = Lifecycle {
            rate: options.rate.map(|n| n.div_ceil(shards)),
            ..options
        };
        let (whole, share) = (
            decode::encode_options(&options),
            decode::encode_options(&share),
        );
        let calls = (0..self.queues.len()).map(|q| {
            let mine = if self.sharding.is_some() && q != self.control() {
                share.clone()
            } else {
                whole.clone()
            };
            let args = vec![Arg::Tube(t.clone()), Arg::Text(mine)];
            self.op_on(q, Kind::Moves, "set_tube", args)
        });
        for got in join_all(calls).await {
            got?;
        }
        Ok(())
    }

    async fn tube_settings(&self, t: &Tube) -> StoreResult<Lifecycle> {
        let got = self
            .op(Kind::Reads, "tube_settings", vec![Arg::Tube(t.clone())])
            .await?;
        decode::decode_options(&parse::<String>(got)?)
    }

    async fn all_tube_settings(&self) -> StoreResult<TubeSettings> {
        let got: Vec<(String, String)> =
            parse(self.op(Kind::Reads, "all_settings", Vec::new()).await?)?;
        let mut all = got
            .into_iter()
            .map(|(t, o)| Ok((tube(&t)?, decode::decode_options(&o)?)))
            .collect::<StoreResult<Vec<_>>>()?;
        all.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        Ok(all.into())
    }

    async fn set_schedule(&self, name: &str, encoded: Bytes) -> StoreResult<bool> {
        let args = vec![
            Arg::Text(name.to_string()),
            Arg::Body(encoded),
            Arg::Int(MAX_SCHEDULES as u64),
        ];
        let n: i64 = parse(self.op_on(0, Kind::Moves, "set_schedule", args).await?)?;
        Ok(n == 1)
    }

    async fn remove_schedule(&self, name: &str) -> StoreResult<bool> {
        let args = vec![
            Arg::Text(name.to_string()),
            Arg::Static(""),
            Arg::Int(MAX_SCHEDULES as u64),
        ];
        let n: i64 = parse(self.op_on(0, Kind::Moves, "set_schedule", args).await?)?;
        Ok(n == 1)
    }

    async fn schedules(&self) -> StoreResult<Vec<Bytes>> {
        let got = self.op_on(0, Kind::Reads, "schedules", Vec::new()).await?;
        let got: Vec<Vec<u8>> = parse(got)?;
        Ok(got.into_iter().map(Bytes::from).collect())
    }

    async fn release_all(
        &self,
        conn: ConnId,
        held: &[JobId],
        failed: bool,
    ) -> StoreResult<Vec<Tube>> {
        let mut tubes = Vec::new();
        let failed = if failed { "1" } else { "" };
        for (shard, ids) in self.ids_by_shard(held) {
            let args = vec![Arg::Owner(conn), Arg::Text(ids), Arg::Static(failed)];
            let got = self.op_on(shard, Kind::Moves, "release_all", args).await?;
            let got: Vec<String> = parse(got)?;
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
        if let Some(s) = &self.sharding {
            return self.tick_sharded(s).await;
        }
        // The alive mark and the check on the other processes, at most
        // every HEARTBEAT: under load the timer ticks hundreds of times a
        // second, and they were four of a tick's twenty-odd commands.
        let now = Instant::now();
        let beat_due = (self.beat.lock().unwrap_or_else(PoisonError::into_inner))
            .is_none_or(|last| now.duration_since(last) >= HEARTBEAT);
        let process = if beat_due {
            Arg::Text(self.process.clone())
        } else {
            Arg::Static("")
        };
        let args = vec![Arg::Int(TICK_BATCH), process];
        let (next, lost, ready) = ticked(self.op(Kind::Moves, "tick", args).await?)?;
        if beat_due {
            *self.beat.lock().unwrap_or_else(PoisonError::into_inner) = Some(now);
            self.keep_refs(lost);
        }
        Ok(Tick { ready, next })
    }

    async fn attach(&self, t: &Tube, how: TubeRef) -> StoreResult<()> {
        self.tube_ref(t, how, 1, true).await
    }

    async fn attach_kept(&self, t: &Tube, how: TubeRef) -> StoreResult<()> {
        self.tube_ref(t, how, 1, false).await
    }

    async fn detach(&self, t: &Tube, how: TubeRef) -> StoreResult<()> {
        self.tube_ref(t, how, -1, false).await
    }

    fn events(&self) -> Option<mpsc::Receiver<StoreEvent>> {
        self.events.lock().ok()?.take()
    }

    async fn catch_up(&self) -> bool {
        let Some(ask) = &self.catch_up else {
            return false;
        };
        let (done, caught) = oneshot::channel();
        if ask.send(done).is_err() {
            return false;
        }
        // A primary that does not answer at once is in trouble; the
        // reserve then answers with what this process knows.
        matches!(
            tokio::time::timeout(CATCH_UP_LIMIT, caught).await,
            Ok(Ok(()))
        )
    }

    fn max_sleep(&self) -> Option<Duration> {
        Some(MAX_SLEEP)
    }

    /// On one Redis, the tick that serves the workers a tube's rate held
    /// back must come as the next second of Redis's clock begins, and
    /// nothing else tells this process's timer of it (a shard of a cluster
    /// does: `wake_by`). Without this a held-back worker waited for the
    /// timer's idle tick, up to a second late.
    fn held_back(&self) -> Option<Duration> {
        if self.sharding.is_some() || !self.held_back.swap(false, Ordering::Relaxed) {
            return None;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        // A few milliseconds in, for clocks a little apart; a tick too
        // early finds the limit's end ahead and sleeps until it.
        let into = Duration::from_nanos(u64::from(now.subsec_nanos()));
        Some(Duration::from_secs(1) - into + Duration::from_millis(2))
    }

    fn call_limit(&self) -> Option<Duration> {
        Some(conn::COMMAND_LIMIT)
    }

    /// Takes down this process's alive mark. The others' next heartbeat
    /// (within half a second) no longer counts it among the live, and takes
    /// over the shards it ticked: waiting for the mark to expire left them
    /// unticked for up to 3 s at every stop of a rolling restart. Its use
    /// and watch counts go as for a process that died, once it has been
    /// seen missing long enough; its connections, closed, have taken theirs
    /// down already.
    async fn leave(&self) {
        let mut conn = self.conn.clone();
        let mut del = redis::cmd("DEL");
        del.arg(format!("{}alive:{}", self.tag, self.process));
        if let Err(e) = conn::bounded(del.query_async::<()>(&mut conn)).await {
            tracing::warn!(error = %e, "could not tell the other processes this one is stopping; they take over its work once its alive mark expires");
        }
    }

    fn describe(&self) -> String {
        match &self.sharding {
            Some(_) => format!(
                "Redis Cluster, {SHARDS} shards, control keys under {}",
                self.tag
            ),
            None => format!("Redis, keys under {}", self.tag),
        }
    }
}

impl RedisStore {
    /// `delete` or `finish` (`mode`), one script with the rule as argument.
    async fn remove(&self, conn: ConnId, id: &JobId, mode: &'static str) -> StoreResult<bool> {
        let (_, n): (usize, i64) = self
            .move_job(
                "delete",
                vec![Arg::Owner(conn)],
                id,
                vec![Arg::Static(mode)],
            )
            .await?;
        Ok(n == 1)
    }

    /// One kick call in `shard`: up to `bound` (at most [`BATCH`] a call)
    /// jobs of `kind` ('' to let the shard choose); returns how many, and
    /// the kind.
    async fn kick_in(
        &self,
        shard: usize,
        t: &Tube,
        bound: u64,
        kind: &str,
    ) -> StoreResult<(u64, String)> {
        let (mut kicked, mut kind) = (0, kind.to_string());
        while kicked < bound {
            let batch = (bound - kicked).min(BATCH);
            let args = vec![Arg::Tube(t.clone()), Arg::Int(batch), Arg::Text(kind)];
            let got = self.op_on(shard, Kind::Moves, "kick", args).await?;
            let (n, k): (u64, String) = parse(got)?;
            kicked += n;
            kind = k;
            if n < batch {
                break;
            }
        }
        Ok((kicked, kind))
    }

    /// `peek` in `shard`, by id (`mode` "id") or the first job of a tube's
    /// state index; `known` are tubes the job may be in.
    async fn peek_in(
        &self,
        shard: usize,
        mode: &'static str,
        arg: Arg,
        known: &[Tube],
    ) -> StoreResult<Option<JobBody>> {
        let got = self
            .op_on(shard, Kind::Reads, "peek", vec![Arg::Static(mode), arg])
            .await?;
        Ok(job_body(got, known)?.map(|(job, _)| job))
    }

    /// The first job of `tube` in the state index `mode`: on a cluster,
    /// in the shard whose first is the first of all, as `reserve` (ready)
    /// or `kick` (buried, delayed) would take them.
    async fn peek_tube(&self, mode: &'static str, t: &Tube) -> StoreResult<Option<JobBody>> {
        let known = std::slice::from_ref(t);
        if self.sharding.is_none() {
            return self.peek_in(0, mode, Arg::Tube(t.clone()), known).await;
        }
        let share = self.firsts(t, mode, 1).await?;
        match share.iter().position(|&n| n > 0) {
            Some(shard) => self.peek_in(shard, mode, Arg::Tube(t.clone()), known).await,
            None => Ok(None),
        }
    }

    /// On a cluster: how many of the first `n` jobs of `tube` in state
    /// `kind`, over all shards, each shard holds.
    async fn firsts(&self, t: &Tube, kind: &'static str, n: u64) -> StoreResult<Vec<u64>> {
        let args = || vec![Arg::Tube(t.clone()), Arg::Static(kind), Arg::Int(n)];
        let all: Vec<Vec<Value>> = self.every("firsts", args, false).await?;
        let mut merged: Vec<(f64, String, usize)> = Vec::new();
        for (shard, v) in all.into_iter().enumerate() {
            for pair in v.chunks(2) {
                if let [score, key] = pair {
                    merged.push((parse(score.clone())?, parse(key.clone())?, shard));
                }
            }
        }
        merged.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut share = vec![0u64; SHARDS];
        for (_, _, shard) in merged
            .into_iter()
            .take(usize::try_from(n).unwrap_or(usize::MAX))
        {
            share[shard] += 1;
        }
        Ok(share)
    }

    /// What an `import` call sent at `sent` that did not answer -1 did.
    fn imported(
        &self,
        shard: usize,
        sent: Instant,
        job: &WholeJob,
        got: Value,
    ) -> StoreResult<PutOutcome> {
        if got == Value::Int(0) {
            return Ok(PutOutcome::Exists(job.id.clone()));
        }
        let id = job_id(got)?;
        if job.state == JobState::Delayed {
            self.due_in(shard, sent, job.time_left);
        }
        Ok(PutOutcome::Inserted(id))
    }

    /// One `import` call for `job` in `shard`, with the key and mode the
    /// script takes (see `import.lua`).
    async fn import_on(
        &self,
        shard: usize,
        job: &WholeJob,
        key: String,
        mode: &'static str,
    ) -> StoreResult<Value> {
        let name = match &job.id {
            JobId::Client(name) => Arg::Text(name.to_string()),
            JobId::Server(_) => Arg::Static(""),
        };
        // Its holder is not here: a reserved job comes in ready.
        let state = match job.state {
            JobState::Reserved => JobState::Ready,
            state => state,
        };
        let c = job.counters;
        let args = vec![
            Arg::Tube(job.tube.clone()),
            name,
            Arg::Text(key),
            Arg::Static(mode),
            Arg::Int(job.pri.into()),
            Arg::Int(millis(job.delay)),
            Arg::Int(millis(job.ttr)),
            Arg::Body(job.body.clone()),
            Arg::Text(decode::encode_options(&job.options)),
            Arg::Static(state.name()),
            Arg::Int(millis(job.time_left)),
            // When it was put, as a time, not an age: an age is counted
            // from a moment that passes on its way here, and a job moved
            // again and again grew younger.
            Arg::Int(put_at_ms(job.put_at, job.age)),
            Arg::Int(job.bury_order),
            Arg::Int(c.reserves.into()),
            Arg::Int(c.timeouts.into()),
            Arg::Int(c.releases.into()),
            Arg::Int(c.buries.into()),
            Arg::Int(c.kicks.into()),
            Arg::Int(job.tries.into()),
            Arg::Int(job.dead.into()),
        ];
        self.op_on(shard, Kind::Puts, "import", args).await
    }

    /// Asks for the cluster's slot map if it is time to, and learns from it
    /// which primary serves each shard. A failure keeps what was known: it
    /// only decides where new jobs go.
    async fn learn_slot_map(&self, s: &Sharding, now: Instant) {
        if !s.chooses() {
            return;
        }
        {
            let mut mapped = self.mapped.lock().unwrap_or_else(PoisonError::into_inner);
            if mapped.is_some_and(|last| now.duration_since(last) < SLOT_MAP_EVERY) {
                return;
            }
            *mapped = Some(now);
        }
        let slots: Vec<usize> = s.tags[..SHARDS]
            .iter()
            .map(|t| slot(t.as_bytes()))
            .collect();
        match self.conn.clone().primaries_of(&slots).await {
            Ok(Some(primaries)) => {
                if s.set_primaries(&primaries) {
                    let mut distinct = primaries.clone();
                    distinct.sort();
                    distinct.dedup();
                    tracing::info!(
                        primaries = distinct.len(),
                        "learnt which primary serves each shard: new jobs go to shards spread evenly over them"
                    );
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not read the cluster's slot map; new jobs go to the shards chosen before")
            }
        }
    }

    /// The next key of this process's block of the cluster-wide sequence
    /// that suits a job of `tube` (any key for a client-chosen id, `None`),
    /// taking a new block from the control slot when this one runs out. The
    /// keys that do not suit are skipped for good: a tube on 3 of the 64
    /// shards has server ids about 21 apart, in the order of its puts.
    async fn next_key(&self, s: &Sharding, tube: Option<&Tube>) -> StoreResult<u64> {
        let mask = tube.map_or(u64::MAX, |t| s.mask(t));
        let mut keys = self.keys.lock().await;
        // A tube on some of the shards takes them in turn. Taking the next
        // key that suits it instead made its shard depend on where the
        // other tubes' puts had left the sequence: a reviewer's three tubes
        // put in turn each went to 2 of their 4 shards, and random turns
        // gave a primary 459 of a tube's 1,000 jobs and another 52.
        let shard = match tube {
            Some(t) if mask != u64::MAX => {
                let turn = shards::slot(t.as_str().as_bytes()) % TURNS;
                let shard = shards::after(mask, usize::from(keys.turns[turn]));
                keys.turns[turn] = shard as u8;
                Some(shard)
            }
            _ => None,
        };
        loop {
            let key = match shard {
                Some(shard) => shards::key_at_or_after(keys.next, shard),
                None => keys.next,
            };
            if key < keys.end {
                keys.next = key + 1;
                return Ok(key);
            }
            // A tube on a few of the shards uses one key in so many: the
            // block is as much larger, so that a call for keys still comes
            // once every KEY_BLOCK puts or so.
            let n = KEY_BLOCK * SHARDS as u64 / u64::from(mask.count_ones().max(1));
            let got = self.op(Kind::Moves, "ids", vec![Arg::Int(n)]).await?;
            let last: u64 = parse(got)?;
            (keys.next, keys.end) = (last + 1 - n, last + 1);
        }
    }

    /// Changes this process's count of connections using or watching `t`
    /// by `delta`; with `undo_failed`, a change answered as failed is
    /// undone.
    async fn tube_ref(
        &self,
        t: &Tube,
        how: TubeRef,
        delta: i64,
        undo_failed: bool,
    ) -> StoreResult<()> {
        let field = match how {
            TubeRef::Using => "u",
            TubeRef::Watching => "w",
        };
        // A change for a command answered as failed (an error, or the
        // command cut off at its deadline, which drops this future) is
        // undone: the connection goes on without it, and so must the
        // process's count, whatever Redis did with the change.
        let mut undo = Undo {
            refs: &self.refs,
            tube: t,
            field,
            delta,
            armed: undo_failed,
        };
        let result = self.refs.change(t, field, delta).await;
        undo.armed &= result.is_err();
        result
    }
}

/// Undoes a change of a use or watch count when dropped armed; disarmed
/// once the change is answered as made.
struct Undo<'a> {
    refs: &'a Refs,
    tube: &'a Tube,
    field: &'static str,
    delta: i64,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.refs.undo(self.tube, self.field, self.delta);
        }
    }
}
