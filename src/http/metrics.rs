//! `GET /metrics`: the server's figures for Prometheus, in OpenMetrics text
//! (or, to a client that does not ask for it, Prometheus' older text format,
//! which is what `curl` and `promtool check metrics` read).
//!
//! Everything is gathered at scrape time from what the server keeps anyway
//! (the store's `stats` and `stats-tube` figures, the process's command and
//! connection counters), so commands pay nothing for it; the two figures
//! nothing else keeps, the timer's lateness and the store call times, are
//! measured by the broker ([`crate::metrics`]) from the first scrape on.
//! The store is asked first and the figures encoded after
//! (`metrics/encode.rs`), since encoding cannot wait on it.
//!
//! Label sets are bounded: a `tube` label only for tubes that exist, and for
//! at most [`MAX_TUBES`] of them.
//!
//! With tokens on (`--tokens`), a scrape needs `Authorization: Bearer` with
//! a token that has no tube prefix, whatever its roles (Prometheus sends it
//! from `authorization: credentials` in its scrape config). Without one, or
//! with a wrong one (logged and slowed down, as a wrong `auth` is), it is
//! 401; a token with a prefix is 403. Why any role: the figures are what
//! `stats`, `list-tubes` and `stats-tube` tell any token, and a scraper
//! should not need the admin token, which could delete every job. Why no
//! prefix: the per-tube series name every tube, which a prefix token is
//! never shown.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{StreamExt, TryStreamExt, stream};
use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::registry::Registry;
use tracing::warn;

use super::api::{Caller, bearer_token, output};
use crate::auth::failure_delay;
use crate::broker::Broker;
use crate::error::{StoreError, StoreResult};
use crate::protocol::reply::Reply;
use crate::protocol::session::Shared;
use crate::store::Store;
use axum::Extension;

mod encode;

use encode::{Figures, StoreFigures};

/// The most tubes that get series of their own (the oldest, in `list-tubes`
/// order, so the same ones from scrape to scrape). Each costs one
/// `stats-tube` per scrape and nine series, so a client that creates a
/// million tubes cannot make a scrape a million calls long: the others are
/// left out of the per-tube families (counted in
/// `delayq_tubes_unlisted`), and their jobs still count in the server-wide
/// ones.
pub const MAX_TUBES: usize = 1000;

/// Tubes whose figures are asked for at once (on Redis they share calls).
const TUBES_AT_ONCE: usize = 32;

/// The content type of OpenMetrics text, as prometheus-client writes it.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics route.
pub fn routes<S: Store>() -> Router<Arc<Shared<S>>> {
    Router::new().route("/metrics", get(scrape::<S>))
}

/// One scrape: the figures, in the format the client asked for.
async fn scrape<S: Store>(
    State(shared): State<Arc<Shared<S>>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
) -> Response {
    let caller = caller.map(|Extension(c)| c);
    if let Some(refusal) = refusal(&shared, &headers, caller.as_ref()).await {
        return refusal;
    }
    // After the token check: a refused client must not start the timings.
    shared.broker.instruments().switch_on();
    let figures = gather(&shared).await;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(figures));
    // Prometheus asks for OpenMetrics first in its Accept header.
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let mut body = String::with_capacity(16 * 1024);
    let (encoded, content_type) = if openmetrics {
        (text::encode(&mut body, &registry), OPENMETRICS)
    } else {
        (
            prometheus_text::encode(&mut body, &registry),
            prometheus_text::CONTENT_TYPE,
        )
    };
    if encoded.is_err() {
        // Writing into a String fails only if an encoder refuses a figure.
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot encode the metrics",
        )
            .into_response();
    }
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The answer to a scrape the tokens do not allow, if they are on (see the
/// module's notes); the JSON API's bodies and headers, so a client sees one
/// kind of refusal on the whole listener.
async fn refusal<S: Store>(
    shared: &Shared<S>,
    headers: &HeaderMap,
    caller: Option<&Caller>,
) -> Option<Response> {
    let tokens = shared.config.tokens.as_ref()?;
    let Some(token) = bearer_token(headers) else {
        // A missing token is no guess: it is refused at once, unlogged.
        return Some(output::reply(Reply::Unauthorized));
    };
    match tokens.check(token) {
        Some(grant) => {
            if let Some(caller) = caller {
                caller.failed(false);
            }
            if grant.prefix().is_none() {
                None
            } else {
                Some(output::reply(Reply::Forbidden))
            }
        }
        None => {
            // As the API's: logged with the client's address, and each
            // failure in a row on the connection waits longer.
            let failures = caller.map_or(1, |c| c.failed(true));
            let peer = caller.map(Caller::peer);
            warn!(route = "/metrics", ?peer, failures, "authentication failed");
            tokio::time::sleep(failure_delay(failures)).await;
            Some(output::reply(Reply::Unauthorized))
        }
    }
}

/// Reads every figure. The process's own are always there; the store's
/// only if it answered (on Redis within its call limit).
async fn gather<S: Store>(shared: &Shared<S>) -> Figures {
    // Read before the store is asked, as `stats` does.
    let connections = shared.stats.connections_now();
    let broker = &shared.broker;
    let store = match store_figures(broker).await {
        Ok(store) => Some(store),
        Err(e) => {
            warn!(error = %e, "/metrics: the store did not answer; its figures are left out");
            None
        }
    };
    let instruments = broker.instruments();
    Figures {
        connections,
        commands: shared.stats.commands().collect(),
        draining: shared.stats.is_draining(),
        uptime: shared.stats.uptime(),
        max_job_size: shared.config.max_job_size,
        store,
        lateness: instruments.lateness(),
        store_calls: instruments.store_calls(),
    }
}

/// The store's figures: server-wide, and for the first [`MAX_TUBES`] tubes.
async fn store_figures<S: Store>(broker: &Broker<S>) -> StoreResult<StoreFigures> {
    let limit = broker.call_limit();
    let (stats, waiting) = within(limit, broker.stats()).await?;
    let tubes = within(limit, broker.list_tubes()).await?;
    let unlisted = tubes.len().saturating_sub(MAX_TUBES) as u64;
    let tubes: Vec<_> = stream::iter(tubes.iter().take(MAX_TUBES).cloned())
        .map(|tube| async move { within(limit, broker.stats_tube(&tube)).await })
        .buffered(TUBES_AT_ONCE)
        // A tube gone since it was listed has no figures.
        .try_filter_map(|found| async move { Ok(found) })
        .try_collect()
        .await?;
    Ok(StoreFigures {
        stats,
        waiting,
        tubes,
        unlisted,
    })
}

/// `call`, failed if it takes longer than `limit`.
async fn within<T>(
    limit: Option<Duration>,
    call: impl Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    let Some(limit) = limit else {
        return call.await;
    };
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(StoreError::Unavailable(format!(
            "no answer within {limit:?}"
        )))
    })
}
