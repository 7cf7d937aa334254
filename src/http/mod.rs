//! The HTTP front end (`--http ADDR:PORT`, off by default): a JSON API over
//! the same commands as the text protocol, the Prometheus `/metrics`, and
//! the dashboard, all on one listener, built on axum.
//!
//! * `api.rs`: the JSON API under `/v1`, and its OpenAPI document;
//! * `metrics.rs`: `/metrics`, in OpenMetrics text;
//! * `dashboard.rs`: the page at `/`, which works through the API.
//!
//! Every route reaches the store the way a text connection does: it builds
//! a [`crate::protocol::command::Command`] and runs it in a
//! [`crate::protocol::session::Session`], so the rules (validation, the
//! replies, the engine calls) are the text protocol's, written once.

use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::protocol::session::Shared;
use crate::store::Store;

pub mod api;
pub mod dashboard;
pub mod metrics;

/// The connection id every HTTP request acts as: HTTP has no connection
/// that could hold a reservation, so a job reserved over HTTP is held by
/// "HTTP" until it is finished, released, buried or its TTR runs out, and
/// any HTTP request may act on it.
pub const HTTP_CONN: crate::store::ConnId = u64::MAX - 1;

/// Every route, over `shared`.
pub fn router<S: Store>(shared: Arc<Shared<S>>) -> Router {
    Router::new()
        .merge(api::routes::<S>())
        .merge(metrics::routes::<S>())
        .merge(dashboard::routes::<S>())
        .with_state(shared)
}

/// Serves the HTTP front end on `listener` until `shutdown`.
pub async fn serve<S: Store>(
    listener: TcpListener,
    shared: Arc<Shared<S>>,
    shutdown: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "HTTP listening");
    }
    let app = router(shared);
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    if let Err(e) = served {
        warn!(error = %e, "the HTTP listener failed");
    }
}
