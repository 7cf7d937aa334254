//! The connection every call shares, to whichever Redis the deployment runs:
//! one server, a cluster (the redis crate's cluster client routes each call
//! to its slot's primary and follows redirects and failovers), or a primary
//! found through Sentinel (asked again whenever the one in use fails, so a
//! failover is followed without a restart).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::connect::{Nodes, cluster_client};
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, SingleNodeRoutingInfo,
};
use redis::sentinel::SentinelClient;
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};
use tracing::{info, warn};

/// How long a Redis call may take before it fails with `INTERNAL_ERROR`.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a command may wait on Redis in all, however many calls it
/// makes, before it is answered `INTERNAL_ERROR` (a `reserve-with-timeout
/// T`: `TIMED_OUT`, T after it began plus this). Clients are promised a
/// reply within 2 s of when it was due, and the reply's own way (the
/// timer firing on a busy runtime, the write) must fit in that too: with
/// the whole 2 s here, puts and reserves answered while Redis was frozen
/// came 2.00 to 2.01 s after they were due, never before.
pub(super) const COMMAND_LIMIT: Duration = Duration::from_millis(1800);

/// Where the jobs are: what the command line named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One Redis server, by URL.
    Single(String),
    /// A Redis Cluster, by the URLs of some of its nodes (seeds).
    Cluster(Vec<String>),
    /// The primary that Sentinel names `master`, asked of these sentinels.
    Sentinel {
        /// The sentinels' URLs.
        sentinels: Vec<String>,
        /// The name the sentinels monitor the primary under.
        master: String,
    },
}

/// A shared, cheaply cloned connection to the deployment.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(Watched),
    Sentinel(Followed),
}

impl Conn {
    /// Sends `FUNCTION LOAD` of `source`: on a cluster to every primary
    /// (functions are not shared between shards; replicas get them by
    /// replication), replacing what is there, which is safe because the
    /// library's name carries a hash of its source.
    pub async fn load(&mut self, source: &str) -> RedisResult<()> {
        match self {
            Conn::Cluster(c) => {
                let mut cmd = redis::cmd("FUNCTION");
                cmd.arg("LOAD").arg("REPLACE").arg(source);
                let all = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                c.route(cmd, all).await.map(drop)
            }
            other => {
                let loaded: RedisResult<String> = redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg(source)
                    .query_async(other)
                    .await;
                match loaded {
                    Ok(_) => Ok(()),
                    // Another delayq process of this version loaded it first.
                    Err(e) if e.to_string().contains("already exists") => Ok(()),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

impl Conn {
    /// On a cluster, the primary serving each of `slots` (its node id), as
    /// a primary's `CLUSTER SLOTS` says; `None` on one Redis.
    pub async fn primaries_of(&mut self, slots: &[usize]) -> RedisResult<Option<Vec<String>>> {
        let Conn::Cluster(c) = self else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
        let reply = c.route(cmd, routing).await?;
        slot_owners(reply, slots).map(Some)
    }
}

/// One range of slots in a `CLUSTER SLOTS` reply, and its primary.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range {
    first: usize,
    last: usize,
    /// The primary's node id (since Redis 4), else its address: a primary
    /// keeps its name whatever address it is reached at.
    name: String,
    host: String,
    port: u16,
}

/// The ranges of a `CLUSTER SLOTS` reply: entries of the first slot, the
/// last, then the primary as its address and node id, then its replicas.
fn ranges(reply: &Value) -> RedisResult<Vec<Range>> {
    let bad = |what: &str| RedisError::from((ErrorKind::Parse, "CLUSTER SLOTS", what.to_string()));
    let Value::Array(entries) = reply else {
        return Err(bad("not an array"));
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return Err(bad("an entry that is not an array"));
        };
        let [first, last, primary, ..] = &fields[..] else {
            return Err(bad("an entry without its primary"));
        };
        let Value::Array(node) = primary else {
            return Err(bad("a primary that is not an array"));
        };
        let [host, port, rest @ ..] = &node[..] else {
            return Err(bad("a primary without an address"));
        };
        let host: String = redis::from_redis_value(host.clone())?;
        let port: u16 = redis::from_redis_value(port.clone())?;
        let name = match rest.first() {
            Some(id) => redis::from_redis_value::<String>(id.clone())?,
            None => format!("{host}:{port}"),
        };
        ranges.push(Range {
            first: redis::from_redis_value(first.clone())?,
            last: redis::from_redis_value(last.clone())?,
            name,
            host,
            port,
        });
    }
    Ok(ranges)
}

/// The range holding `slot`, if a primary serves it.
fn range_of(ranges: &[Range], slot: usize) -> Option<&Range> {
    ranges.iter().find(|r| (r.first..=r.last).contains(&slot))
}

/// The primary of each of `slots` in a `CLUSTER SLOTS` reply, by name.
fn slot_owners(reply: Value, slots: &[usize]) -> RedisResult<Vec<String>> {
    let ranges = ranges(&reply)?;
    slots
        .iter()
        .map(|&slot| {
            range_of(&ranges, slot)
                .map(|r| r.name.clone())
                .ok_or_else(|| {
                    RedisError::from((
                        ErrorKind::Parse,
                        "CLUSTER SLOTS",
                        format!("slot {slot} has no primary"),
                    ))
                })
        })
        .collect()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => Box::pin(c.command(cmd)),
            Conn::Sentinel(c) => Box::pin(c.command(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => Box::pin(c.commands(pipeline, offset, count)),
            Conn::Sentinel(c) => Box::pin(c.commands(pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(_) => 0,
            Conn::Sentinel(_) => 0,
        }
    }
}

/// The primary Sentinel names, followed: a connection to it is kept while
/// it works; once a call fails in a way a failover causes (the connection
/// dropped or refused, a timeout, `READONLY` from a primary turned replica),
/// the next call asks the sentinels again.
#[derive(Clone)]
pub(super) struct Followed {
    sentinel: Arc<tokio::sync::Mutex<SentinelClient>>,
    current: Arc<Mutex<Option<MultiplexedConnection>>>,
}

/// A reply that says the server is a replica now: a primary Sentinel
/// named was demoted in a failover, and its connection still works.
fn read_only(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.code() == "READONLY")
}

/// Whether `e` means the connection in use may no longer reach the primary.
fn lost_primary(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.code() == Some("READONLY")
}

impl Followed {
    /// Asks `sentinels` for the primary they call `master`.
    pub fn new(sentinels: &[String], master: &str) -> RedisResult<Followed> {
        let client = SentinelClient::build(
            sentinels.to_vec(),
            master,
            None,
            redis::sentinel::SentinelServerType::Master,
        )?;
        Ok(Followed {
            sentinel: Arc::new(tokio::sync::Mutex::new(client)),
            current: Arc::new(Mutex::new(None)),
        })
    }

    /// A client for the primary the sentinels name now.
    pub async fn primary(&self) -> RedisResult<redis::Client> {
        self.sentinel.lock().await.async_get_client().await
    }

    async fn conn(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(c) = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(c);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT));
        let conn = self
            .primary()
            .await?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets the primary in use if `result` says it is gone or no longer
    /// the primary; `demoted` looks inside a reply that came back whole.
    fn check<T>(&self, result: RedisResult<T>, demoted: impl Fn(&T) -> bool) -> RedisResult<T> {
        let lost = match &result {
            Err(e) => lost_primary(e),
            Ok(reply) => demoted(reply),
        };
        if lost {
            *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        result
    }

    async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let result = match self.conn().await {
            Ok(mut c) => c.req_packed_command(cmd).await,
            Err(e) => Err(e),
        };
        self.check(result, read_only)
    }

    async fn commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let result = match self.conn().await {
            Ok(mut c) => c.req_packed_commands(pipeline, offset, count).await,
            Err(e) => Err(e),
        };
        // A pipeline's replies come back whole, errors among them (a call
        // and its WAIT, with `--redis-wait`).
        self.check(result, |replies| replies.iter().any(read_only))
    }
}

/// How long a cluster connection may fail every call to one slot before
/// it is built anew. A failover leaves slots without a primary for about the cluster's
/// node timeout, and the connection recovers from that by itself; but the
/// redis crate's connection has been seen never to finish refreshing its
/// slots after a primary was killed under load, timing out every call
/// until the process restarted (as in redis-rs #2418). A fresh connection
/// asks the seeds for the slots from scratch.
const STUCK_AFTER: Duration = Duration::from_secs(4);

/// How often, while calls to some slot fail, the watchdog asks the cluster
/// whether that slot has a new primary; and at most how many times in a
/// row (the next failure starts it again).
const PROBE_EVERY: Duration = Duration::from_millis(500);
const PROBES: usize = 60;

/// Which primary serves each of `slots` now, asked of every primary there
/// was when the connection was made, the first answer taken (a frozen one
/// never answers): the address of one that served one of them then and
/// does no longer. Asked on connections of its own: the cluster
/// connection's requests wait while it refreshes its slot map, and that
/// refresh can itself be waiting on the frozen node.
async fn moved(nodes: &Nodes, then: &[Range], slots: &[usize]) -> Option<(String, u16)> {
    let asks = then
        .iter()
        .map(|r| (r.host.clone(), r.port))
        .collect::<std::collections::HashSet<_>>()
        .into_iter()
        .filter_map(|(host, port)| nodes.reach(&host, port))
        .map(|node| {
            Box::pin(async move {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CALL_TIMEOUT))
                    .set_response_timeout(Some(CALL_TIMEOUT));
                let mut conn = redis::Client::open(node)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                let reply: Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await?;
                ranges(&reply)
            })
        })
        .collect::<Vec<_>>();
    if asks.is_empty() {
        return None;
    }
    let (now, _) = futures_util::future::select_ok(asks).await.ok()?;
    slots.iter().find_map(|&slot| {
        let (was, now) = (range_of(then, slot)?, range_of(&now, slot)?);
        (now.name != was.name).then(|| (was.host.clone(), was.port))
    })
}

/// A cluster connection with a watchdog: once the cluster says a failing
/// slot has a new primary (asked of every primary), or once every
/// call to some slot has failed for [`STUCK_AFTER`], a new connection is
/// built in the background and replaces it, while the old one keeps
/// serving (or failing) until then.
#[derive(Clone)]
pub(super) struct Watched {
    nodes: Arc<Nodes>,
    state: Arc<Mutex<Watch>>,
}

struct Watch {
    conn: ClusterConnection,
    /// The slots' primaries when `conn` was made (empty if they could not
    /// be learnt): what the connection sends each slot's calls to.
    primaries: Vec<Range>,
    /// For each slot (named by the hash tag of its keys) whose calls fail,
    /// when the first of their unbroken run of failures ended. Per slot: a
    /// frozen primary's replica is promoted, but the client, never told
    /// (the frozen node answers nothing, not even `MOVED`), goes on sending
    /// its slots' calls there, while the other primaries' calls succeed.
    failing: HashMap<Vec<u8>, Instant>,
    /// Whether a new connection is being built.
    rebuilding: bool,
    /// When the cluster was last asked about a failing slot's primary, and
    /// whether it is being asked now.
    probed: Option<Instant>,
    probing: bool,
}

/// Whether `e` says the call may not have reached a working primary, as
/// opposed to an answer from one (a script's error, a wrong type).
fn unreachable(e: &RedisError) -> bool {
    lost_primary(e)
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::MasterDown) | ErrorKind::ClusterConnectionNotFound
        )
}

/// A connection to the cluster through `nodes` (avoiding `avoid`, nodes
/// taken for frozen), and the slots' primaries as it starts.
async fn connect_through(
    nodes: &Nodes,
    avoid: &[(String, u16)],
) -> RedisResult<(ClusterConnection, Vec<Range>)> {
    let mut conn = cluster_client(nodes, avoid)?.get_async_connection().await?;
    // Known from the start, in case the seeds are gone by the time a
    // connection is made anew.
    let primaries = nodes
        .ask(&mut conn)
        .await
        .and_then(|reply| ranges(&reply).ok())
        .unwrap_or_default();
    Ok((conn, primaries))
}

impl Watched {
    /// Connects to the cluster through `nodes`.
    pub async fn connect(nodes: Arc<Nodes>) -> RedisResult<Watched> {
        let (conn, primaries) = connect_through(&nodes, &[]).await?;
        Ok(Watched {
            nodes,
            state: Arc::new(Mutex::new(Watch {
                conn,
                primaries,
                failing: HashMap::new(),
                rebuilding: false,
                probed: None,
                probing: false,
            })),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watch> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn conn(&self) -> ClusterConnection {
        self.lock().conn.clone()
    }

    /// Notes how a call to the slot of `tag` went, and starts a new
    /// connection if that slot's calls have failed for too long, or asks
    /// the cluster whether the slot has a new primary.
    fn check<T>(&self, tag: &[u8], result: RedisResult<T>) -> RedisResult<T> {
        let mut watch = self.lock();
        match &result {
            Err(e) if unreachable(e) => {
                let since = match watch.failing.get(tag) {
                    Some(&since) => since,
                    None => *watch
                        .failing
                        .entry(tag.to_vec())
                        .or_insert_with(Instant::now),
                };
                if watch.rebuilding {
                    return result;
                }
                if since.elapsed() >= STUCK_AFTER {
                    watch.rebuilding = true;
                    warn!(
                        failing_for = ?since.elapsed(),
                        slot_of = %String::from_utf8_lossy(tag),
                        error = %e,
                        "every Redis Cluster call to a slot has failed for a while: connecting anew"
                    );
                    tokio::spawn(self.clone().rebuild(Vec::new()));
                } else if !tag.is_empty()
                    && !watch.probing
                    && watch.probed.is_none_or(|at| at.elapsed() >= PROBE_EVERY)
                {
                    watch.probing = true;
                    tokio::spawn(self.clone().probe());
                }
            }
            _ => {
                if !watch.failing.is_empty() {
                    watch.failing.remove(tag);
                }
            }
        }
        result
    }

    /// While calls to some slots fail, asks the primaries every
    /// [`PROBE_EVERY`] which primary serves those slots (see [`moved`]), and connects anew
    /// at once if one of them is no longer the one this connection sends
    /// their calls to. A primary that hangs (SIGSTOP, a black hole) is
    /// failed over by the cluster within its node timeout, but the crate,
    /// never told, goes on sending that primary's calls to it: without
    /// this, puts on its slots failed for [`STUCK_AFTER`] past their first
    /// timeout (on the test cluster, until 8.8 s after the promotion).
    /// Asked while the calls fail rather than at each failure, so that the
    /// calls made after a promotion go to the new primary, not only those
    /// made after the next call timed out.
    async fn probe(self) {
        for _ in 0..PROBES {
            let (primaries, slots) = {
                let mut watch = self.lock();
                let slots: Vec<usize> = watch
                    .failing
                    .keys()
                    .filter(|tag| !tag.is_empty())
                    .map(|tag| super::shards::slot(tag))
                    .collect();
                if watch.rebuilding || slots.is_empty() {
                    watch.probing = false;
                    return;
                }
                watch.probed = Some(Instant::now());
                (watch.primaries.clone(), slots)
            };
            let asked = tokio::time::timeout(CALL_TIMEOUT, moved(&self.nodes, &primaries, &slots));
            if let Ok(Some(old)) = asked.await {
                let mut watch = self.lock();
                watch.probing = false;
                if !watch.rebuilding {
                    watch.rebuilding = true;
                    warn!(
                        old_primary = %format!("{}:{}", old.0, old.1),
                        "a Redis Cluster slot whose calls fail has a new primary: connecting anew"
                    );
                    tokio::spawn(self.clone().rebuild(vec![old]));
                }
                return;
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
        self.lock().probing = false;
    }

    /// Makes a new connection and puts it in place of the current one;
    /// `avoid`: nodes not to start from (a frozen one would hold up the
    /// start by the connect timeout).
    async fn rebuild(self, avoid: Vec<(String, u16)>) {
        let fresh =
            tokio::time::timeout(CALL_TIMEOUT * 2, connect_through(&self.nodes, &avoid)).await;
        let mut watch = self.lock();
        watch.rebuilding = false;
        match fresh {
            Ok(Ok((conn, primaries))) => {
                info!("new Redis Cluster connection in use");
                watch.conn = conn;
                watch.primaries = primaries;
                // The new connection gets its own time to show it works.
                watch.failing.clear();
            }
            Ok(Err(e)) => warn!(error = %e, "cannot connect to the Redis Cluster yet"),
            Err(_) => warn!("connecting to the Redis Cluster timed out"),
        }
    }

    async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let result = bounded(self.conn().req_packed_command(cmd)).await;
        self.check(tag_of(cmd), result)
    }

    async fn commands(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let result = bounded(self.conn().req_packed_commands(pipeline, offset, count)).await;
        self.check(pipeline.cmd_iter().next().map_or(&[], tag_of), result)
    }

    async fn route(&self, cmd: Cmd, routing: RoutingInfo) -> RedisResult<Value> {
        let tag = tag_of(&cmd).to_vec();
        let result = bounded(self.conn().route_command(cmd, routing)).await;
        self.check(&tag, result)
    }
}

/// The hash tag (`{...}`) of the first argument of `cmd` that has one,
/// or nothing: every key delayq uses in one slot has that slot's tag, and
/// a call's key comes before its other tagged arguments.
fn tag_of(cmd: &Cmd) -> &[u8] {
    cmd.args_iter()
        .find_map(|arg| match arg {
            redis::Arg::Simple(bytes) => {
                let open = memchr::memchr(b'{', bytes)?;
                let close = open + 1 + memchr::memchr(b'}', &bytes[open + 1..])?;
                (close > open + 1).then(|| &bytes[open..=close])
            }
            _ => None,
        })
        .unwrap_or(&[])
}

/// `call`'s result, or a timeout a little after [`CALL_TIMEOUT`]. The
/// cluster client applies that timeout itself, but inside the task that
/// drives its connection: a connection stuck in its slot refresh never
/// answers a call it took, and a call that never ends would hold its
/// batch's place for good (every later operation of that shard, or of the
/// control slot, would queue behind it).
pub(super) async fn bounded<T>(call: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    const MARGIN: Duration = Duration::from_millis(100);
    match tokio::time::timeout(CALL_TIMEOUT + MARGIN, call).await {
        Ok(result) => result,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "Redis gave no answer in time",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn each_slot_is_named_by_its_primary() {
        let node =
            |port: i64, id: &str| Value::Array(vec![text("127.0.0.1"), Value::Int(port), text(id)]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node(7000, "aaa"),
                node(7003, "ddd"),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node(7001, "bbb")]),
            // An old Redis names no node id.
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16383),
                Value::Array(vec![text("127.0.0.1"), Value::Int(7002)]),
            ]),
        ]);
        let got = slot_owners(reply.clone(), &[0, 5460, 5461, 16383]).unwrap();
        assert_eq!(got, ["aaa", "aaa", "bbb", "127.0.0.1:7002"]);
        // A slot no primary serves (a cluster not fully set up) is an error.
        let partial = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(100),
            node(7000, "aaa"),
        ])]);
        assert!(slot_owners(partial, &[200]).is_err());
        assert!(slot_owners(Value::Nil, &[0]).is_err());
    }
}
