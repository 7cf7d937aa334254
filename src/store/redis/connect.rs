//! Reaching Redis and checking it is fit to hold jobs: the multiplexed
//! connection every call shares, the `default` tube, the eviction policy,
//! and the function library.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tracing::warn;

use super::batch;
use super::decode::fail;
use super::library::Library;
use crate::error::StoreResult;

/// How long a Redis call may take before it fails with `INTERNAL_ERROR`.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to Redis, checked and prepared for the keys under `tag`.
pub(super) async fn connect(
    client: &redis::Client,
    tag: &str,
    library: &Library,
) -> StoreResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CALL_TIMEOUT))
        .set_response_timeout(Some(CALL_TIMEOUT))
        .set_number_of_retries(2);
    let mut conn = client
        .get_connection_manager_with_config(config)
        .await
        .map_err(fail)?;
    redis::cmd("ZADD")
        .arg(format!("{tag}tubes"))
        .arg("NX")
        .arg(0)
        .arg("default")
        .query_async::<()>(&mut conn)
        .await
        .map_err(fail)?;
    warn_if_evicting(&mut conn).await;
    batch::load(&mut conn, library).await.map_err(fail)?;
    Ok(conn)
}

/// Warns loudly if Redis may evict keys, since an evicted key is a lost job.
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
