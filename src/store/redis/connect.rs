//! Reaching Redis and checking it is fit to hold jobs: the multiplexed
//! connection every call shares (to one server or to a cluster), the
//! `default` tube, the eviction policy, and the function library.

use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterClient;
use tracing::warn;

use super::conn::{CALL_TIMEOUT, Conn, Watched};
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

/// A connection to a cluster through some of its nodes. The client routes
/// each call to the primary of its slot and follows `MOVED`, `ASK` and
/// failovers; it may also send a call again, which the library's call
/// tokens make harmless. Its retries are kept within the time a call may
/// take, so a command's reply is never later than that.
pub(super) async fn cluster(seeds: &[String]) -> StoreResult<Conn> {
    let client = ClusterClient::builder(seeds.to_vec())
        .connection_timeout(CALL_TIMEOUT)
        .response_timeout(CALL_TIMEOUT)
        .overall_response_timeout(Some(CALL_TIMEOUT))
        .retries(8)
        .min_retry_wait(20)
        .max_retry_wait(500)
        .build()
        .map_err(fail)?;
    let conn = Watched::connect(client).await.map_err(fail)?;
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
