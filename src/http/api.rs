//! The JSON API under `/v1` (filled in by the HTTP API work).

use std::sync::Arc;

use axum::Router;

use crate::protocol::session::Shared;
use crate::store::Store;

/// The API's routes.
pub fn routes<S: Store>() -> Router<Arc<Shared<S>>> {
    Router::new()
}
