//! Events from the other delayq processes sharing a Redis: a dedicated
//! pub/sub connection on the `events` channel, where the library announces
//! tubes that got ready jobs and due times earlier than any known, so that a
//! job made ready by one process reaches a worker blocked on another.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::{BoxFuture, try_join_all};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{PushInfo, PushKind, RedisError, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::conn::{CALL_TIMEOUT, Followed, bounded};
use super::connect::Nodes;
use super::shards::{SHARDS, Sharding, slot};
use crate::names::{Tube, parse_u64};
use crate::store::StoreEvent;

/// Where the events channel is.
pub(super) enum Source {
    /// One Redis server.
    Client(Box<redis::Client>),
    /// The primary Sentinel names, asked again at every reconnection.
    Sentinel(Followed),
}

impl Source {
    async fn client(&self) -> Result<redis::Client, RedisError> {
        match self {
            Source::Client(c) => Ok((**c).clone()),
            Source::Sentinel(f) => f.primary().await,
        }
    }
}

/// How often the listener retries while Redis is unreachable.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// On Sentinel, how often the listener asks the sentinels which primary
/// its channel should be on: a second apart, each asking costs a sentinel a
/// connection and two commands, and the primary it names a connection and
/// a `ROLE` (the redis crate checks the role of the primary it is told of).
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// What one message on the channel means: `due:MS`, `schedules:` or a
/// tube's name (which has no colon).
fn event(payload: &[u8]) -> Option<StoreEvent> {
    if payload == b"schedules:" {
        return Some(StoreEvent::Schedules);
    }
    if payload == b"resync:" {
        return Some(StoreEvent::Resync);
    }
    match payload.strip_prefix(b"due:") {
        Some(ms) => parse_u64(ms).map(|ms| StoreEvent::Due(Duration::from_millis(ms))),
        None => Tube::parse(payload).map(StoreEvent::Ready),
    }
}

/// Listens on `channel` until `stop`, reconnecting as needed; each
/// (re)connection first sends [`StoreEvent::Resync`], since announcements
/// may have been missed while away.
pub(super) async fn listen(
    source: Source,
    channel: String,
    tx: mpsc::Sender<StoreEvent>,
    stop: CancellationToken,
) {
    let mut connected_before = false;
    loop {
        let session = async {
            // Bounded: a primary that hangs (SIGSTOP, a stalled host) would
            // otherwise hold the listener here for good.
            let client = bounded(source.client()).await?;
            let mut pubsub = bounded(client.get_async_pubsub()).await?;
            bounded(pubsub.subscribe(&channel)).await?;
            if connected_before {
                info!("Redis events channel back");
            }
            let _ = tx.send(StoreEvent::Resync).await;
            let mut messages = pubsub.on_message();
            // A primary that hangs rather than dies never closes the
            // subscription: after its failover the other processes'
            // announcements go to the new primary, and this one would
            // hear none of them. So the sentinels are asked now and then.
            let mut follow = tokio::time::interval(FOLLOW_EVERY);
            follow.tick().await;
            loop {
                tokio::select! {
                    msg = messages.next() => match msg {
                        Some(msg) => {
                            if let Some(event) = event(msg.get_payload_bytes()) {
                                let _ = tx.send(event).await;
                            }
                        }
                        None => break,
                    },
                    _ = follow.tick(), if matches!(source, Source::Sentinel(_)) => {
                        if let Ok(named) = bounded(source.client()).await
                            && named.get_connection_info().addr() != client.get_connection_info().addr()
                        {
                            info!("the sentinels name another primary: the events channel follows");
                            break;
                        }
                    }
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

/// A shard's announcement that a tube got ready jobs, `h TIME TUBE PRI
/// KEY`: the Redis time (µs), the tube, and its first ready job's priority
/// and key.
fn head(payload: &[u8]) -> Option<(u64, Tube, (u64, u64))> {
    let text = std::str::from_utf8(payload.strip_prefix(b"h ")?).ok()?;
    let mut words = text.split(' ');
    let at = words.next()?.parse().ok()?;
    let tube = Tube::parse(words.next()?.as_bytes())?;
    let pri = words.next()?.parse().ok()?;
    let key = u64::from_str_radix(words.next()?, 16).ok()?;
    Some((at, tube, (pri, key)))
}

/// Requests to take in the shards' news up to now, each answered once it
/// has been (see [`listen_shards`]).
pub(super) type CatchUps = mpsc::UnboundedSender<oneshot::Sender<()>>;

/// Listens to every shard's channel of a cluster until `stop` (sharded
/// pub/sub: each channel lives on its shard's primary). A shard's news
/// also goes into `sharding`: where ready jobs are, when it is due.
///
/// The subscriptions are made anew, on a fresh client with a fresh slot
/// map, whenever they may have been lost: a connection dropped, a node
/// unsubscribed a channel (a primary that became a replica does so), or a
/// primary left a `PING` unanswered (a frozen primary drops nothing, and
/// its replica takes over without it). The cluster client's own
/// resubscription was not enough: after a primary was killed and came
/// back as a replica, its shards' channels were left with no subscriber,
/// and blocked workers were never told of their jobs. After every
/// (re)subscription every shard's news may have been missed, so the
/// hints are rebuilt and every shard ticked ([`StoreEvent::Resync`]).
///
/// `catch_ups` ask for the news sent up to now: a `PING` goes to every
/// primary on the connection the news comes by, and since a primary sends
/// its replies and its news on it in order, once every `PONG` is back the
/// news sent before them has arrived; it is taken in, then the requests
/// are answered. Requests that come while a `PING` is out wait for the
/// next one (their news may have been sent after it). `subscribed` is
/// told once the first subscriptions are made.
pub(super) async fn listen_shards(
    nodes: Arc<Nodes>,
    sharding: Arc<Sharding>,
    tx: mpsc::Sender<StoreEvent>,
    mut catch_ups: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    subscribed: oneshot::Sender<()>,
    stop: CancellationToken,
) {
    let mut connected_before = false;
    let mut subscribed = Some(subscribed);
    loop {
        let session = async {
            let (push, mut pushed) = mpsc::unbounded_channel();
            let client = ClusterClient::builder(nodes.all(&[]))
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(push)
                .connection_timeout(CALL_TIMEOUT)
                .response_timeout(CALL_TIMEOUT)
                .build()?;
            let mut conn = client.get_async_connection().await?;
            let channels: Vec<String> = sharding.tags[..SHARDS]
                .iter()
                .map(|t| format!("{t}events"))
                .collect();
            // All at once: one after another, the 64 round trips (and as
            // many `ROLE`s below) kept a fresh or failed-over deployment
            // deaf for 40 ms idle and past half a second on a busy machine.
            try_join_all(channels.iter().map(|channel| {
                let mut conn = conn.clone();
                async move { conn.ssubscribe(channel).await }
            }))
            .await?;
            // A slot map fetched from a node that has not yet learnt it was
            // demoted sends a channel's subscription to that node, now a
            // replica: it takes it without a redirect, and hears the
            // shard's news only as replication brings it, after the PING
            // of a catch-up has come back from the primary (a reviewer saw
            // an eighth of `reserve-with-timeout 0` miss a job just put).
            // The node each channel went to is asked its role; a replica
            // among them, and the subscriptions are made again.
            let roles = try_join_all(channels.iter().map(|channel| {
                let at = u16::try_from(slot(channel.as_bytes())).unwrap_or_default();
                let on = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                    at,
                    SlotAddr::Master,
                )));
                let mut conn = conn.clone();
                async move { bounded(conn.route_command(redis::cmd("ROLE"), on)).await }
            }))
            .await?;
            if !roles.iter().all(is_primary) {
                return Err(lost("a shard's channel was subscribed on a replica"));
            }
            probe(&conn, &channels, &mut pushed, &sharding, &tx).await?;
            // Learnt now and again later, so that the next session can
            // begin from nodes that are up even if every seed is down.
            let _ = nodes.ask(&mut conn).await;
            if connected_before {
                info!("Redis Cluster events channels back");
            }
            sharding.forget_all();
            let _ = tx.send(StoreEvent::Resync).await;
            if let Some(first) = subscribed.take() {
                let _ = first.send(());
            }
            let mut asked: Vec<oneshot::Sender<()>> = Vec::new();
            let mut pinged: Vec<oneshot::Sender<()>> = Vec::new();
            let mut ping: Option<BoxFuture<'static, bool>> = None;
            let mut check = tokio::time::interval(CHECK_EVERY);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            check.tick().await;
            let mut checking = false;
            let mut checks = 0_u32;
            loop {
                tokio::select! {
                    msg = pushed.recv() => match msg {
                        Some(msg) => {
                            if let Err(why) = take(msg, &channels, &sharding, &tx).await {
                                return Err(lost(why));
                            }
                        }
                        None => break,
                    },
                    Some(done) = catch_ups.recv() => asked.push(done),
                    _ = check.tick(), if ping.is_none() => {
                        checking = true;
                        checks = checks.wrapping_add(1);
                    }
                    answered = async { ping.as_mut().expect("a PING is out").await },
                        if ping.is_some() =>
                    {
                        ping = None;
                        while let Ok(msg) = pushed.try_recv() {
                            if let Err(why) = take(msg, &channels, &sharding, &tx).await {
                                return Err(lost(why));
                            }
                        }
                        if !answered {
                            // The reserves waiting go on with what is known
                            // (their requests are dropped unanswered).
                            return Err(lost("a primary did not answer a PING"));
                        }
                        for done in pinged.drain(..) {
                            let _ = done.send(());
                        }
                    }
                }
                if ping.is_none() && (checking || !asked.is_empty()) {
                    // A check's tick is always taken up here, in the same
                    // turn (it fires only while no PING is out).
                    let learn = (checking && checks.is_multiple_of(LEARN_EVERY))
                        .then(|| Arc::clone(&nodes));
                    checking = false;
                    pinged = std::mem::take(&mut asked);
                    let mut conn = conn.clone();
                    ping = Some(Box::pin(async move {
                        let ping = redis::cmd("PING");
                        let answered = bounded(ping.query_async::<Value>(&mut conn)).await.is_ok();
                        if let (true, Some(nodes)) = (answered, learn) {
                            let _ = nodes.ask(&mut conn).await;
                        }
                        answered
                    }));
                }
            }
            drop(conn);
            Ok::<(), RedisError>(())
        };
        tokio::select! {
            ended = session => match ended {
                Ok(()) => warn!("Redis Cluster events channels closed; reconnecting"),
                Err(e) => warn!(error = %e, "Redis Cluster events channels unavailable; retrying"),
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

/// The longest wait for a probe's message to come back.
const PROBE_LIMIT: Duration = Duration::from_secs(2);

/// Publishes a message of its own on every shard's channel, where the
/// shard's news is published, and waits until each has come back on the
/// subscriptions: only then is every channel heard. In CI, after a primary
/// was killed, workers on another process were never told of the jobs put
/// on its shards, though every `ROLE` had answered a primary (probably: a
/// subscription and a `ROLE` are each sent where the slot map of the moment
/// says, and around a failover it changes between one and the other).
/// News that comes meanwhile is taken in as usual; other processes ignore
/// the probes (a tube's name has no colon).
async fn probe(
    conn: &ClusterConnection,
    channels: &[String],
    pushed: &mut mpsc::UnboundedReceiver<PushInfo>,
    sharding: &Sharding,
    tx: &mpsc::Sender<StoreEvent>,
) -> Result<(), RedisError> {
    let token = format!(
        "probe:{:016x}",
        RandomState::new().hash_one((std::process::id(), Instant::now()))
    );
    try_join_all(channels.iter().map(|channel| {
        let mut conn = conn.clone();
        let publish = redis::cmd("SPUBLISH").arg(channel).arg(&token).to_owned();
        async move { bounded(publish.query_async::<Value>(&mut conn)).await }
    }))
    .await?;
    let mut unheard = channels.len();
    let mut heard = vec![false; channels.len()];
    let limit = tokio::time::sleep(PROBE_LIMIT);
    tokio::pin!(limit);
    while unheard > 0 {
        tokio::select! {
            msg = pushed.recv() => {
                let Some(msg) = msg else {
                    return Err(lost("the subscriptions' connection closed"));
                };
                match probed(&msg, channels, &token) {
                    Some(shard) => {
                        if !std::mem::replace(&mut heard[shard], true) {
                            unheard -= 1;
                        }
                    }
                    None => take(msg, channels, sharding, tx).await.map_err(lost)?,
                }
            }
            () = &mut limit => {
                return Err(lost(&format!(
                    "{unheard} of the shards' channels did not hear a message published on them"
                )));
            }
        }
    }
    Ok(())
}

/// The shard whose channel `msg` is this listener's probe `token` on.
fn probed(msg: &PushInfo, channels: &[String], token: &str) -> Option<usize> {
    let (PushKind::SMessage, Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
        (&msg.kind, msg.data.first(), msg.data.get(1))
    else {
        return None;
    };
    if payload != token.as_bytes() {
        return None;
    }
    channels.iter().position(|c| c.as_bytes() == channel)
}

/// How often the shards' primaries are asked for a `PING` on the
/// subscriptions' connections when nothing else asks: one per primary
/// every 2 s, so that a frozen primary's failover is noticed within about
/// 4 s (the `PING`'s own time limit included).
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Every how many checks the cluster's nodes are asked for again (one
/// `CLUSTER SLOTS` a minute), so that nodes added since are known.
const LEARN_EVERY: u32 = 30;

/// Whether `ROLE` answered that the node is a primary.
fn is_primary(role: &Value) -> bool {
    match role {
        Value::Array(fields) => matches!(
            fields.first(),
            Some(Value::BulkString(word)) if word == b"master"
        ),
        _ => false,
    }
}

/// Why the subscriptions are made anew, as an error of the session.
fn lost(why: &str) -> RedisError {
    RedisError::from(std::io::Error::other(format!(
        "{why}; subscribing to every shard again"
    )))
}

/// Takes in one message of the shards' channels; an error says that some
/// subscriptions may be lost.
async fn take(
    msg: PushInfo,
    channels: &[String],
    sharding: &Sharding,
    tx: &mpsc::Sender<StoreEvent>,
) -> Result<(), &'static str> {
    match msg.kind {
        PushKind::SMessage => {
            let (Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
                (msg.data.first(), msg.data.get(1))
            else {
                return Ok(());
            };
            let Some(shard) = channels.iter().position(|c| c.as_bytes() == channel) else {
                return Ok(());
            };
            if let Some((at, t, first)) = head(payload) {
                sharding.head(shard, at, &t, Some(first));
                let _ = tx.send(StoreEvent::Ready(t)).await;
            } else {
                match event(payload) {
                    Some(StoreEvent::Due(after)) => {
                        sharding.due_at(shard, Instant::now() + after);
                        let _ = tx.send(StoreEvent::Due(after)).await;
                    }
                    Some(StoreEvent::Schedules) => {
                        let _ = tx.send(StoreEvent::Schedules).await;
                    }
                    _ => {}
                }
            }
        }
        PushKind::Disconnection => return Err("a connection to a node was lost"),
        // Sent by a node that no longer serves the channel's slot (a
        // primary turned replica, a slot moved), or in answer to an
        // unsubscription, which delayq never sends.
        PushKind::SUnsubscribe => {
            let ours = matches!(msg.data.first(), Some(Value::BulkString(channel))
                if channels.iter().any(|c| c.as_bytes() == channel));
            if ours {
                return Err("a node unsubscribed a shard's channel");
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_their_events() {
        assert_eq!(
            event(b"due:1500"),
            Some(StoreEvent::Due(Duration::from_millis(1500)))
        );
        assert_eq!(
            event(b"orders"),
            Some(StoreEvent::Ready(Tube::parse(b"orders").unwrap()))
        );
        assert_eq!(event(b"due:x"), None);
        assert_eq!(event(b"schedules:"), Some(StoreEvent::Schedules));
        assert_eq!(event(b"resync:"), Some(StoreEvent::Resync));
        assert_eq!(
            head(b"h 1700000000000001 orders 1024 00000000002a"),
            Some((
                1_700_000_000_000_001,
                Tube::parse(b"orders").unwrap(),
                (1024, 42)
            ))
        );
        assert_eq!(head(b"h 17 orders x 2a"), None);
        assert_eq!(head(b"orders"), None);
        assert_eq!(event(b"a:b"), None);
        // Another process's probe means nothing here.
        assert_eq!(event(b"probe:00000000000000ff"), None);
        assert_eq!(head(b"probe:00000000000000ff"), None);
    }

    #[test]
    fn a_probe_is_known_by_its_token_and_channel() {
        let channels = vec!["{a}events".to_string(), "{b}events".to_string()];
        let token = "probe:0123456789abcdef";
        // Which shard's probe a push is, if it is this listener's.
        let shard = |kind, channel: &str, payload: &str| {
            let data = vec![
                Value::BulkString(channel.as_bytes().to_vec()),
                Value::BulkString(payload.as_bytes().to_vec()),
            ];
            probed(&PushInfo { kind, data }, &channels, token)
        };
        assert_eq!(shard(PushKind::SMessage, "{b}events", token), Some(1));
        let another_process = "probe:fedcba9876543210";
        assert_eq!(
            shard(PushKind::SMessage, "{b}events", another_process),
            None
        );
        assert_eq!(shard(PushKind::SMessage, "{c}events", token), None);
        assert_eq!(shard(PushKind::Message, "{a}events", token), None);
    }

    #[test]
    fn roles() {
        let role = |word: &str| {
            Value::Array(vec![
                Value::BulkString(word.as_bytes().to_vec()),
                Value::Int(0),
            ])
        };
        assert!(is_primary(&role("master")));
        assert!(!is_primary(&role("slave")));
        assert!(!is_primary(&Value::Nil));
    }
}
