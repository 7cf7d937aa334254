//! Reaching Redis and checking it is fit to hold jobs: the multiplexed
//! connection every call shares (to one server or to a cluster), the
//! `default` tube, the eviction policy, and the function library.

use std::sync::{Arc, Mutex, PoisonError};

use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisResult, Value};
use tracing::warn;

use super::conn::{CALL_TIMEOUT, Conn, Watched, bounded};
use super::decode::fail;
use super::library::Library;
use crate::error::StoreResult;

/// A connection to one Redis server, which reconnects by itself.
pub(super) async fn single(client: &redis::Client) -> StoreResult<Conn> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CALL_TIMEOUT))
        .set_response_timeout(Some(CALL_TIMEOUT))
        .set_number_of_retries(2);
    let conn = client
        .get_connection_manager_with_config(config)
        .await
        .map_err(fail)?;
    Ok(Conn::Single(conn))
}

/// The nodes a new cluster connection may start from: the seeds the command
/// line named, then every node the cluster itself named when last asked.
/// A connection is made anew after a failover (see `Watched` and the
/// events listener), and from the seeds alone it could not be made while
/// they are all down: a deployment given one seed, whose primary was
/// killed, would have stayed without its events until that node came back.
pub(super) struct Nodes {
    seeds: Vec<ConnectionInfo>,
    /// Host and port of each node `CLUSTER SLOTS` named last.
    named: Mutex<Vec<(String, u16)>>,
}

impl Nodes {
    /// The seeds, by URL.
    pub fn new(seeds: &[String]) -> RedisResult<Nodes> {
        let seeds = seeds
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(Nodes {
            seeds,
            named: Mutex::new(Vec::new()),
        })
    }

    /// Where to start a connection: the seeds first, then the nodes the
    /// cluster named, reached as the first seed is (its password, its TLS);
    /// none of `avoid` (host and port), unless that would leave none.
    pub fn all(&self, avoid: &[(String, u16)]) -> Vec<ConnectionInfo> {
        let all = self.everyone();
        let avoided = |n: &ConnectionInfo| {
            avoid
                .iter()
                .any(|(host, port)| n.addr().to_string() == format!("{host}:{port}"))
        };
        if all.iter().all(avoided) {
            return all;
        }
        all.into_iter().filter(|n| !avoided(n)).collect()
    }

    fn everyone(&self) -> Vec<ConnectionInfo> {
        let mut all = self.seeds.clone();
        let named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        for (host, port) in named.iter() {
            let Some(node) = self.reach(host, *port) else {
                break;
            };
            let seen = all
                .iter()
                .any(|n| n.addr().to_string() == node.addr().to_string());
            if !seen {
                all.push(node);
            }
        }
        all
    }

    /// How to reach the node at `host` and `port`: as the first seed is
    /// reached (its password, its TLS); `None` without seeds.
    pub fn reach(&self, host: &str, port: u16) -> Option<ConnectionInfo> {
        let first = self.seeds.first()?;
        let addr = match first.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_string(), port),
        };
        Some(first.clone().set_addr(addr))
    }

    /// Asks one node of `conn`'s cluster for the cluster's nodes, and
    /// returns its `CLUSTER SLOTS` reply; a failure leaves those known
    /// before.
    pub async fn ask(&self, conn: &mut ClusterConnection) -> Option<Value> {
        let slots = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let anyone = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let reply = bounded(conn.route_command(slots, anyone)).await.ok()?;
        self.learn(&reply);
        Some(reply)
    }

    /// Takes in the nodes a `CLUSTER SLOTS` reply names (primaries and
    /// replicas; a node whose address the cluster does not know, `?`, is
    /// left out), in place of those named before.
    pub fn learn(&self, slots: &Value) {
        let Value::Array(ranges) = slots else {
            return;
        };
        let mut named: Vec<(String, u16)> = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                continue;
            };
            for node in fields.iter().skip(2) {
                let Value::Array(node) = node else {
                    continue;
                };
                let host = match node.first() {
                    Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
                    Some(Value::SimpleString(h)) => h.clone(),
                    _ => continue,
                };
                let Some(Value::Int(port)) = node.get(1) else {
                    continue;
                };
                let Ok(port) = u16::try_from(*port) else {
                    continue;
                };
                if !host.is_empty() && host != "?" && !named.contains(&(host.clone(), port)) {
                    named.push((host, port));
                }
            }
        }
        if !named.is_empty() {
            *self.named.lock().unwrap_or_else(PoisonError::into_inner) = named;
        }
    }
}

/// A client for calls to the cluster, started from `nodes`. It routes each
/// call to the primary of its slot and follows `MOVED`, `ASK` and
/// failovers; it may also send a call again, which the library's call
/// tokens make harmless. Its retries are kept within the time a call may
/// take, so a command's reply is never later than that. `avoid`: nodes not
/// to start from (see [`Nodes::all`]).
pub(super) fn cluster_client(nodes: &Nodes, avoid: &[(String, u16)]) -> RedisResult<ClusterClient> {
    ClusterClient::builder(nodes.all(avoid))
        .connection_timeout(CALL_TIMEOUT)
        .response_timeout(CALL_TIMEOUT)
        .overall_response_timeout(Some(CALL_TIMEOUT))
        .retries(8)
        .min_retry_wait(20)
        .max_retry_wait(500)
        .build()
}

/// A connection to a cluster, watched (see [`Watched`]).
pub(super) async fn cluster(nodes: &Arc<Nodes>) -> StoreResult<Conn> {
    let conn = Watched::connect(Arc::clone(nodes)).await.map_err(fail)?;
    Ok(Conn::Cluster(conn))
}

/// Checks and prepares the deployment for the keys under `tag`: the
/// `default` tube, the eviction policy, the function library.
pub(super) async fn prepare(conn: &mut Conn, tag: &str, library: &Library) -> StoreResult<()> {
    redis::cmd("ZADD")
        .arg(format!("{tag}tubes"))
        .arg("NX")
        .arg(0)
        .arg("default")
        .query_async::<()>(conn)
        .await
        .map_err(fail)?;
    warn_if_evicting(conn).await;
    conn.load(&library.source).await.map_err(fail)?;
    Ok(())
}

/// Warns loudly if Redis may evict keys, since an evicted key is a lost job.
async fn warn_if_evicting(conn: &mut Conn) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn the_nodes_the_cluster_names_follow_the_seeds_reached_as_the_first_is() {
        let nodes = Nodes::new(&["rediss://:secret@127.0.0.1:7000".to_string()]).unwrap();
        nodes.learn(&Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("127.0.0.1", 7000),
                node("10.0.0.2", 7001),
            ]),
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                node("10.0.0.3", 7002),
                node("?", 7003),
            ]),
        ]));
        let all: Vec<String> = nodes
            .all(&[])
            .iter()
            .map(|n| n.addr().to_string())
            .collect();
        assert_eq!(all, ["127.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:7002"]);
        for n in nodes.all(&[]) {
            assert!(matches!(n.addr(), ConnectionAddr::TcpTls { .. }), "{n:?}");
            assert_eq!(n.redis_settings().password(), Some("secret"));
        }
        // A reply that names nothing keeps what was known.
        nodes.learn(&Value::Nil);
        assert_eq!(nodes.all(&[]).len(), 3);
    }
}
