//! `/metrics` (filled in by the metrics work).

use std::sync::Arc;

use axum::Router;

use crate::protocol::session::Shared;
use crate::store::Store;

/// The metrics route.
pub fn routes<S: Store>() -> Router<Arc<Shared<S>>> {
    Router::new()
}
